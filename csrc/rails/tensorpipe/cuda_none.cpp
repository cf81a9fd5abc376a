#include "rails/tensorpipe/cuda.h"

#include <c10/util/Exception.h>

namespace fairring::rails {

namespace {
[[noreturn]] void notBuilt() {
  TORCH_CHECK(
      false,
      "fairring was built without its CUDA path, so its rails cannot move "
      "CUDA tensors; rebuild it with FAIRRING_WITH_CUDA=1 against a CUDA "
      "build of torch (see README.md)");
}
} // namespace

std::vector<std::string> registerCudaChannels(
    tensorpipe::Context& /*context*/,
    const RailsNetwork& /*network*/,
    int /*rank*/) {
  notBuilt();
}

tensorpipe::Buffer cudaBuffer(const Buffer& /*buffer*/) {
  notBuilt();
}

} // namespace fairring::rails
