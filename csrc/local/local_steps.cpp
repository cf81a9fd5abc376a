#include "local/local_steps.h"

#include <c10/util/Exception.h>

#include "local/copy_steps.h"
#include "local/group_steps.h"

namespace fairring {

std::shared_ptr<LocalSteps> makeLocalSteps(LocalGroups groups, int localSize) {
  const bool groupsMade = groups.reduceScatter && groups.allGather;
  TORCH_CHECK(
      (localSize > 1) == (groups.sharedMemory != nullptr || groupsMade),
      "fairring: local groups must exist exactly when machines have 2+ ranks");
  if (groups.sharedMemory) {
    return std::move(groups.sharedMemory);
  }
  if (groupsMade) {
    return std::make_shared<GroupSteps>(
        std::move(groups.reduceScatter), std::move(groups.allGather));
  }
  return std::make_shared<CopySteps>();
}

} // namespace fairring
