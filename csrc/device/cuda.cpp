#include <array>

#include <cuda_runtime_api.h>

#include <c10/core/Event.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "device/streamed.h"

namespace fairring {

namespace {

struct CudaFence final : FenceState {
  CudaFence() : event(c10::DeviceType::CUDA) {}
  c10::Event event;
};

const c10::Event& eventOf(const Fence& fence) {
  return static_cast<const CudaFence*>(fence.state())->event;
}

// One CUDA device's streams, created by the engine and owned by it: no
// `torch.cuda.Stream()`, ProcessGroupNCCL stream or future callback of
// anyone else's can share them (c10's pool hands its streams round-robin to
// everyone), so each holds exactly the work StreamedContext puts there.
class CudaStreams final : public StreamPolicy {
 public:
  explicit CudaStreams(c10::Device device) : device_(device) {
    TORCH_CHECK(
        device.is_cuda() && device.has_index(),
        "fairring: the CUDA engine needs an indexed CUDA device, not ",
        device);
    const c10::cuda::CUDAGuard onDevice(device);
    for (int stream = 0; stream < kStreams; ++stream) {
      C10_CUDA_CHECK(
          cudaStreamCreateWithFlags(&raw_[stream], cudaStreamNonBlocking));
    }
  }

  ~CudaStreams() override {
    // Work still queued completes first; the streams' resources go then.
    const c10::cuda::CUDAGuard onDevice(device_);
    for (cudaStream_t stream : raw_) {
      C10_CUDA_CHECK_WARN(cudaStreamDestroy(stream));
    }
  }

  c10::Device device() const override {
    return device_;
  }
  std::vector<c10::Device> futureDevices() const override {
    return {device_};
  }
  int64_t minShardBytes() const override {
    return kCudaMinShardBytes;
  }

  Fence recordCaller() override {
    const auto current = c10::cuda::getCurrentCUDAStream(device_.index());
    TORCH_CHECK(
        !captured(current),
        "fairring: an all-reduce of a CUDA tensor on the Herring engine was "
        "issued while CUDA graph capture is underway; the engine waits on the "
        "host, which a graph cannot hold. Issue the all-reduce outside the "
        "captured region, or unset FAIRRING_CUDA_ENGINE so that NCCL runs it");
    return recordOn(current);
  }

  void issue(int stream, Stage /*issuer*/, std::function<void()> work)
      override {
    const c10::cuda::CUDAStreamGuard onStream(cudaStream(stream));
    work();
  }

  Fence record(int stream) override {
    return recordOn(cudaStream(stream));
  }

  void wait(int stream, const Fence& fence) override {
    if (fence.state() != nullptr) {
      eventOf(fence).block(cudaStream(stream));
    }
  }

  bool query(const Fence& fence) override {
    return fence.state() == nullptr || eventOf(fence).query();
  }

  void recordUse(const at::Tensor& tensor, int stream) override {
    c10::cuda::CUDACachingAllocator::recordStream(
        tensor.storage().data_ptr(), cudaStream(stream));
  }

  rails::Buffer sendBuffer(const at::Tensor& tensor) override {
    return buffer(tensor, kSendStream);
  }
  rails::Buffer receiveBuffer(const at::Tensor& tensor) override {
    return buffer(tensor, kReceiveStream);
  }
  Fence received(const rails::Buffer& /*received*/) override {
    // After the copy TensorPipe queued on the receive stream before calling
    // back: consumers that wait for this see the data.
    return record(kReceiveStream);
  }

  static bool captured(const c10::cuda::CUDAStream& stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream.stream(), &status));
    return status != cudaStreamCaptureStatusNone;
  }

 private:
  c10::cuda::CUDAStream cudaStream(int stream) const {
    return c10::cuda::getStreamFromExternal(raw_[stream], device_.index());
  }

  static Fence recordOn(const c10::cuda::CUDAStream& stream) {
    auto fence = std::make_shared<CudaFence>();
    fence->event.record(stream);
    return Fence(std::move(fence));
  }

  rails::Buffer buffer(const at::Tensor& tensor, int stream) const {
    return rails::Buffer{
        tensor.data_ptr(),
        static_cast<size_t>(tensor.numel() * tensor.element_size()),
        device_,
        c10::Stream(cudaStream(stream))};
  }

  const c10::Device device_;
  std::array<cudaStream_t, kStreams> raw_{};
};

} // namespace

std::unique_ptr<DeviceContext> makeCudaContext(
    c10::Device device,
    LocalGroups groups) {
  return std::make_unique<StreamedContext>(
      std::make_unique<CudaStreams>(device), std::move(groups));
}

bool cudaGraphCaptureUnderway(c10::Device device) {
  return device.is_cuda() &&
      CudaStreams::captured(
             c10::cuda::getCurrentCUDAStream(device.index()));
}

bool cudaPathBuilt() {
  return true;
}

std::string cudaRuntimeVersion() {
  return std::to_string(CUDART_VERSION / 1000) + "." +
      std::to_string(CUDART_VERSION % 1000 / 10);
}

} // namespace fairring
