#include "cuda_support.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <tensorpipe/tensorpipe.h>
#include <tensorpipe/tensorpipe_cuda.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

namespace fairring::cuda {

bool isBuilt() {
  return true;
}

std::optional<std::string> runtimeVersion() {
  return std::to_string(CUDART_VERSION / 1000) + "." +
      std::to_string(CUDART_VERSION % 1000 / 10);
}

std::optional<std::string> ncclVersion() {
  return std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
      std::to_string(NCCL_PATCH);
}

bool devicesPresent() {
  return c10::cuda::device_count() > 0;
}

c10::intrusive_ptr<c10d::Backend> makeNcclBackend(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout) {
  TORCH_CHECK(
      devicesPresent(),
      "fairring: a CUDA tensor was passed but this process sees no CUDA device");
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  // Own key space: the CPU group shares the parent store.
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("nccl", store);
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(
      prefixed, rank, size, std::move(options));
}

RailsChannels registerRailsChannels(
    tensorpipe::Context& context,
    bool allowGpuDirect) {
  RailsChannels chosen;
#if TENSORPIPE_HAS_CUDA_GDR_CHANNEL
  auto gpuDirect = allowGpuDirect ? tensorpipe::channel::cuda_gdr::create()
                                  : nullptr;
  if (gpuDirect && gpuDirect->isViable()) {
    context.registerChannel(20, "cuda_gdr", gpuDirect);
    chosen.names = "cuda_gdr, ";
    chosen.gpuDirect = true;
  }
#endif
  auto staged = tensorpipe::channel::cuda_basic::create(
      tensorpipe::channel::basic::create());
  TORCH_CHECK(
      staged->isViable(),
      "fairring: TensorPipe cannot move CUDA buffers in this process (its "
      "cuda_basic channel is not viable: is libcuda.so.1 loadable?)");
  context.registerChannel(10, "cuda_basic", staged);
  chosen.names += "cuda_basic";
  return chosen;
}

tensorpipe::Buffer tensorpipeBuffer(void* ptr, const c10::Stream& stream) {
  return tensorpipe::CudaBuffer{ptr, c10::cuda::CUDAStream(stream).stream()};
}

} // namespace fairring::cuda
