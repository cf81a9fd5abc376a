#include <c10/util/Exception.h>

#include "device/capture.h"
#include "device/device.h"

namespace fairring {

std::unique_ptr<DeviceContext> makeCudaContext(
    c10::Device /*device*/, bool /*highPriority*/, bool /*streamHold*/) {
  TORCH_CHECK(
      false,
      "fairring was built without its CUDA path, so it cannot run the engine "
      "on CUDA tensors; rebuild it with FAIRRING_WITH_CUDA=1 against a CUDA "
      "build of torch (see README.md)");
}

bool cudaGraphCaptureUnderway(c10::Device /*device*/) {
  return false;
}

void relaxCaptureChecksOnThisThread() {}

int64_t cudaMemoryInUse(c10::Device /*device*/) {
  return -1;
}

bool cudaPathBuilt() {
  return false;
}

std::string cudaRuntimeVersion() {
  return "";
}

} // namespace fairring
