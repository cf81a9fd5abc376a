#include <torch_headers.h> // first: the precompiled torch headers

#include "backend/engine_factory.h"

#include <c10/util/Exception.h>

#include "device/device.h"
#include "device/emulated.h"
#include "local/copy_steps.h"
#include "local/group_steps.h"
#include "local/local_steps.h"
#include "rails/mesh_factory.h"

namespace fairring {
namespace {

// The steps `groups` stand for on a machine of `localSize` ranks; throws
// unless groups exist exactly when it has 2+ ranks.
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

} // namespace

std::unique_ptr<Engine> makeEngine(
    c10::Device device, const EngineSite& site, Engine::Owner owner) {
  const Topology& topology = site.topology;
  auto localSteps = makeLocalSteps(
      site.innerGroups.localGroups(device), topology.localSize());
  localSteps->setTimeout(site.timeout);
  std::unique_ptr<DeviceContext> context;
  if (device.is_cuda()) {
    context = makeCudaContext(
        device, site.config.highPriorityStreams, site.config.cudaStreamHold);
  } else if (const auto emulated = emulatedDeviceFromEnv()) {
    context = makeEmulatedContext(*emulated, topology.rank());
  } else {
    context = makeCpuContext();
  }
  auto mesh = rails::makeMesh(
      {site.store,
       "fairring/rails/" +
           c10::DeviceTypeName(device.type(), /*lower_case=*/true) + "/",
       topology,
       site.config.network,
       device,
       site.timeout});
  auto timeline = site.config.timelineDirectory.empty()
      ? nullptr
      : std::make_unique<Timeline>(
            site.config.timelineDirectory, site.groupUid, topology, device);
  return std::make_unique<Engine>(
      topology,
      site.config,
      std::move(context),
      std::move(localSteps),
      std::move(mesh),
      site.timeout,
      std::move(timeline),
      std::move(owner));
}

} // namespace fairring
