#include "rails/tensorpipe_cuda.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <tensorpipe/tensorpipe.h>
#include <tensorpipe/tensorpipe_cuda.h>

namespace fairring::rails {

std::string registerCudaChannels(
    tensorpipe::Context& context,
    bool allowGpuDirect) {
  std::string names;
#if TENSORPIPE_HAS_CUDA_GDR_CHANNEL
  auto gpuDirect =
      allowGpuDirect ? tensorpipe::channel::cuda_gdr::create() : nullptr;
  if (gpuDirect && gpuDirect->isViable()) {
    context.registerChannel(20, "cuda_gdr", gpuDirect);
    names = "cuda_gdr, ";
  }
#endif
  auto staged = tensorpipe::channel::cuda_basic::create(
      tensorpipe::channel::basic::create());
  TORCH_CHECK(
      staged->isViable(),
      "fairring: TensorPipe cannot move CUDA buffers in this process (its "
      "cuda_basic channel is not viable: is libcuda.so.1 loadable?)");
  context.registerChannel(10, "cuda_basic", staged);
  return names + "cuda_basic";
}

tensorpipe::Buffer cudaBuffer(const Buffer& buffer) {
  TORCH_CHECK(
      buffer.device.is_cuda() && buffer.stream.has_value(),
      "fairring: a CUDA rails buffer needs a CUDA device and stream");
  return tensorpipe::CudaBuffer{
      buffer.data, c10::cuda::CUDAStream(*buffer.stream).stream()};
}

} // namespace fairring::rails
