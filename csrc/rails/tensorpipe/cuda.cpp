#include "rails/tensorpipe/cuda.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <tensorpipe/tensorpipe.h>
#include <tensorpipe/tensorpipe_cuda.h>

namespace fairring::rails {

std::vector<std::string> registerCudaChannels(
    tensorpipe::Context& context, const RailsNetwork& network, int rank) {
  const auto& channels = network.cudaChannels;
  std::vector<std::string> names;
  for (size_t index = 0; index < channels.size(); ++index) {
    const auto& name = channels[index];
    std::shared_ptr<tensorpipe::channel::Context> channel;
    if (name == "cuda_gdr") {
#if TENSORPIPE_HAS_CUDA_GDR_CHANNEL
      // Without a map, TensorPipe pairs each GPU with its PCI-nearest NIC.
      channel = tensorpipe::channel::cuda_gdr::create(
          network.gpuDirectNics.empty()
              ? tensorpipe::optional<std::vector<std::string>>()
              : network.gpuDirectNics);
#endif
    } else if (name == "cuda_basic") {
      channel = tensorpipe::channel::cuda_basic::create(
          tensorpipe::channel::basic::create());
    } else {
      TORCH_CHECK(false, "fairring: no CUDA rails channel named '", name, "'");
    }
    if (!channel || !channel->isViable()) {
      TORCH_CHECK(
          !network.isRequired(name),
          "fairring: rank ",
          rank,
          ": the rails were asked to use TensorPipe's ",
          name,
          " channel (FAIRRING_CHANNELS), but it is not viable in this "
          "process (cuda_gdr needs libibverbs.so.1, an active InfiniBand or "
          "RoCE device and the nvidia_peermem module; cuda_basic needs "
          "libcuda.so.1)");
      continue;
    }
    // Best first: TensorPipe prefers the highest priority both ends have.
    const auto priority = static_cast<int64_t>(channels.size() - index) * 10;
    context.registerChannel(priority, name, std::move(channel));
    names.push_back(name);
  }
  TORCH_CHECK(
      !names.empty(),
      "fairring: rank ",
      rank,
      ": no TensorPipe channel allowed by "
      "FAIRRING_CHANNELS can move CUDA buffers between machines in this "
      "process (is libcuda.so.1 loadable?)");
  return names;
}

tensorpipe::Buffer cudaBuffer(const Buffer& buffer) {
  TORCH_CHECK(
      buffer.device.is_cuda() && buffer.stream.has_value(),
      "fairring: a CUDA rails buffer needs a CUDA device and stream");
  return tensorpipe::CudaBuffer{
      buffer.data, c10::cuda::CUDAStream(*buffer.stream).stream()};
}

} // namespace fairring::rails
