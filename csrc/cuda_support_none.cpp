#include "cuda_support.h"

#include <c10/util/Exception.h>

namespace fairring::cuda {

bool isBuilt() {
  return false;
}

std::optional<std::string> runtimeVersion() {
  return std::nullopt;
}

std::optional<std::string> ncclVersion() {
  return std::nullopt;
}

bool devicesPresent() {
  return false;
}

namespace {
[[noreturn]] void notBuilt() {
  TORCH_CHECK(
      false,
      "fairring was built without its CUDA path, so it cannot run "
      "collectives on CUDA tensors; rebuild it with FAIRRING_WITH_CUDA=1 "
      "against a CUDA build of torch (see README.md)");
}
} // namespace

c10::intrusive_ptr<c10d::Backend> makeNcclBackend(
    const c10::intrusive_ptr<c10d::Store>& /*store*/,
    int /*rank*/,
    int /*size*/,
    std::chrono::milliseconds /*timeout*/) {
  notBuilt();
}

RailsChannels registerRailsChannels(
    tensorpipe::Context& /*context*/,
    bool /*allowGpuDirect*/) {
  notBuilt();
}

tensorpipe::Buffer tensorpipeBuffer(
    void* /*ptr*/,
    const c10::Stream& /*stream*/) {
  notBuilt();
}

} // namespace fairring::cuda
