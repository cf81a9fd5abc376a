#include <array>
#include <chrono>
#include <thread>

#include <cuda_runtime_api.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "device/device.h"

namespace fairring {

namespace {

// One CUDA device. Streams, all from the pool, each fed by one thread:
//   stage streams  the reduce-scatter, reduce and all-gather stages' own;
//                  each holds one stage's work, in slice order;
//   send, receive  TensorPipe's copies (cuda_basic) and nothing else, so a
//                  copy never waits behind another slice's collective.
// See docs/design.md ("CUDA") for why no cross-rank wait cycle can form.
class CudaContext final : public DeviceContext {
 public:
  CudaContext(c10::Device device, LocalGroups groups)
      : DeviceContext(device, std::move(groups)),
        stageStreams_{
            c10::cuda::getStreamFromPool(false, device.index()),
            c10::cuda::getStreamFromPool(false, device.index()),
            c10::cuda::getStreamFromPool(false, device.index())},
        sendStream_(c10::cuda::getStreamFromPool(false, device.index())),
        receiveStream_(c10::cuda::getStreamFromPool(false, device.index())) {
    TORCH_CHECK(
        device.is_cuda() && device.has_index(),
        "fairring: the CUDA engine needs an indexed CUDA device, not ",
        device);
  }

  Fence adoptInput(const at::Tensor& flat, const at::Tensor& tensor) override {
    // The reduce-scatter stage reads `flat`; the all-gather stage writes it
    // and, when it is a copy, `tensor`.
    recordOn(flat, stream(Stage::kReduceScatter));
    recordOn(flat, stream(Stage::kAllGather));
    recordOn(tensor, stream(Stage::kAllGather));
    return recordOn(c10::cuda::getCurrentCUDAStream(device().index()));
  }

  std::vector<c10::Device> futureDevices() const override {
    return {device()};
  }

  void runStage(Stage stage, const std::function<void()>& loop) override {
    const c10::cuda::CUDAStreamGuard onStageStream(stream(stage));
    loop();
  }

  void waitOnDevice(const Fence& fence) override {
    if (fence.event() != nullptr) {
      fence.event()->block(c10::cuda::getCurrentCUDAStream(device().index()));
    }
  }

  Fence record() override {
    return recordOn(c10::cuda::getCurrentCUDAStream(device().index()));
  }

  bool waitOnHost(const Fence& fence, const std::function<bool()>& cancelled)
      override {
    // Polled rather than synchronised, so that an abort is never stuck
    // behind a GPU that will not finish.
    const c10::Event* event = fence.event();
    while (event != nullptr && !event->query()) {
      if (cancelled()) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    return !cancelled();
  }

  at::TensorOptions memoryOptions() const override {
    return at::TensorOptions().device(device());
  }

  void keepAlive(const at::Tensor& tensor) override {
    for (const auto& stage : stageStreams_) {
      recordOn(tensor, stage);
    }
    recordOn(tensor, sendStream_);
    recordOn(tensor, receiveStream_);
  }

  rails::Buffer sendBuffer(const at::Tensor& tensor) override {
    return buffer(tensor, sendStream_);
  }
  rails::Buffer receiveBuffer(const at::Tensor& tensor) override {
    return buffer(tensor, receiveStream_);
  }
  Fence receivedFence() override {
    // After the copy TensorPipe queued before calling back: consumers that
    // wait for this see the data.
    return recordOn(receiveStream_);
  }

  int64_t minShardBytes() const override {
    return kCudaMinShardBytes;
  }

 protected:
  // NCCL's wait() returns at once: the stage's stream waits for the step,
  // and abort() ends a step that never finishes.
  void waitForLocalStep(const c10::intrusive_ptr<c10d::Work>& work) override {
    work->wait();
  }

 private:
  const c10::cuda::CUDAStream& stream(Stage stage) const {
    return stageStreams_[static_cast<int>(stage)];
  }

  static Fence recordOn(const c10::cuda::CUDAStream& stream) {
    auto event = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
    event->record(stream);
    return Fence(std::move(event));
  }

  static void recordOn(
      const at::Tensor& tensor,
      const c10::cuda::CUDAStream& stream) {
    c10::cuda::CUDACachingAllocator::recordStream(
        tensor.storage().data_ptr(), stream);
  }

  rails::Buffer buffer(
      const at::Tensor& tensor,
      const c10::cuda::CUDAStream& stream) const {
    return rails::Buffer{
        tensor.data_ptr(),
        static_cast<size_t>(tensor.numel() * tensor.element_size()),
        device(),
        c10::Stream(stream)};
  }

  const std::array<c10::cuda::CUDAStream, kStages> stageStreams_;
  const c10::cuda::CUDAStream sendStream_;
  const c10::cuda::CUDAStream receiveStream_;
};

} // namespace

std::unique_ptr<DeviceContext> makeCudaContext(
    c10::Device device,
    LocalGroups groups) {
  return std::make_unique<CudaContext>(device, std::move(groups));
}

bool cudaPathBuilt() {
  return true;
}

std::string cudaRuntimeVersion() {
  return std::to_string(CUDART_VERSION / 1000) + "." +
      std::to_string(CUDART_VERSION % 1000 / 10);
}

} // namespace fairring
