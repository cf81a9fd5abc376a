#include <array>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include <c10/core/Event.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "device/capture.h"
#include "device/cuda_signals.h"
#include "device/streamed.h"
#include "log.h"

namespace fairring {

namespace {

struct CudaFence final : FenceState {
  CudaFence() : event(c10::DeviceType::CUDA) {}
  c10::Event event;
};

// The engine's threads may query events and allocate while another thread
// of the user's captures a CUDA graph in cudaStreamCaptureModeGlobal, which
// such calls from any thread would invalidate; in relaxed mode this thread's
// calls are not prohibited. (TensorPipe's own threads are outside this.)
using RelaxedCapture = c10::cuda::CUDAStreamCaptureModeGuard;
constexpr cudaStreamCaptureMode kRelaxed = cudaStreamCaptureModeRelaxed;

const c10::Event& eventOf(const Fence& fence) {
  return static_cast<const CudaFence*>(fence.state())->event;
}

// Streams that only fairring's engines use, kept for the process's life:
// an engine takes five and gives them back when it goes, so no two live
// engines share one. They are never destroyed, because the caching allocator
// records an event on every stream a block was used on when that block is
// freed, which may be long after the engine (a caller's tensor).
class EngineStreams {
 public:
  using Set = std::array<cudaStream_t, StreamPolicy::kStreams>;
  // How long a stopped engine's streams get to finish their work.
  static constexpr std::chrono::milliseconds kIdleWait{2000};

  // `highPriority`: streams of the device's greatest priority, else of the
  // default (lowest) one; each kind has its own spares.
  static Set take(c10::Device device, bool highPriority) {
    std::lock_guard<std::mutex> lock(mutex());
    auto& spare = spares()[{device.index(), highPriority}];
    Set set{};
    for (auto& stream : set) {
      if (!spare.empty()) {
        stream = spare.back();
        spare.pop_back();
        continue;
      }
      const c10::cuda::CUDAGuard onDevice(device);
      int lowest = 0;
      int greatest = 0;
      C10_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &greatest));
      C10_CUDA_CHECK(cudaStreamCreateWithPriority(
          &stream, cudaStreamNonBlocking, highPriority ? greatest : lowest));
    }
    return set;
  }

  // Only a stream with nothing left on it goes back: one that still holds
  // work (a local step whose abort did not finish, a kernel that spins for a
  // dead peer) is retired for the process's life, so that no later engine's
  // work queues behind it. Waits at most kIdleWait for the work to finish.
  static void giveBack(c10::Device device, bool highPriority, const Set& set) {
    const RelaxedCapture relaxed(kRelaxed);
    const c10::cuda::CUDAGuard onDevice(device);
    const auto until = std::chrono::steady_clock::now() + kIdleWait;
    std::vector<cudaStream_t> idle;
    int retired = 0;
    for (cudaStream_t stream : set) {
      cudaError_t status = cudaStreamQuery(stream);
      while (status == cudaErrorNotReady &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        status = cudaStreamQuery(stream);
      }
      if (status == cudaSuccess) {
        idle.push_back(stream);
      } else {
        (void)cudaGetLastError(); // a sticky error is the context's, not ours
        ++retired;
      }
    }
    if (retired > 0) {
      notice(
          LogLevel::kWarning,
          c10::str(
              "fairring: ",
              retired,
              " stream(s) of a stopped engine on ",
              device,
              " still hold work after ",
              kIdleWait.count(),
              " ms (a local step whose abort did not finish); they are "
              "retired, "
              "never given to another engine"));
    }
    std::lock_guard<std::mutex> lock(mutex());
    auto& spare = spares()[{device.index(), highPriority}];
    spare.insert(spare.end(), idle.begin(), idle.end());
  }

 private:
  static std::mutex& mutex() {
    static std::mutex guard;
    return guard;
  }
  using Kind = std::pair<c10::DeviceIndex, bool>; // device, high priority
  static std::map<Kind, std::vector<cudaStream_t>>& spares() {
    static std::map<Kind, std::vector<cudaStream_t>> byKind;
    return byKind;
  }
};

// One CUDA device's streams, fairring's own: no `torch.cuda.Stream()`,
// ProcessGroupNCCL stream or future callback of anyone else's can share them
// (c10's pool hands its streams round-robin to everyone), so each holds
// exactly the work StreamedContext puts there, and work an earlier engine
// left on them, which waits for nothing of this one's.
class CudaStreams final : public StreamPolicy {
 public:
  CudaStreams(c10::Device device, bool highPriority, bool streamHold)
      : device_(checked(device)),
        highPriority_(highPriority),
        raw_(EngineStreams::take(device_, highPriority)),
        signals_(streamHold ? CudaSignals::make(device_) : nullptr) {}

  ~CudaStreams() override {
    if (signals_) {
      signals_->open(); // nothing is left to wait for: the streams drain
    }
    EngineStreams::giveBack(device_, highPriority_, raw_);
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
  bool mayRunInLaunchOrder() const override {
    return true;
  }

  Fence recordCaller() override {
    // Never under graph capture: the backend refuses such an op before it
    // reaches the engine (cudaGraphCaptureUnderway).
    return recordOn(c10::cuda::getCurrentCUDAStream(device_.index()));
  }

  void issue(
      int stream, Queue /*issuer*/, std::function<void()> work) override {
    const RelaxedCapture relaxed(kRelaxed);
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
    const RelaxedCapture relaxed(kRelaxed);
    return fence.state() == nullptr || eventOf(fence).query();
  }

  void recordUse(const at::Tensor& tensor, int stream) override {
    c10::cuda::CUDACachingAllocator::recordStream(
        tensor.storage().data_ptr(), cudaStream(stream));
  }

  bool launchesAhead() const override {
    return signals_ != nullptr;
  }
  at::TensorOptions railsMemoryOptions() const override {
    // Pinned: the copies to and from it run on the engine's streams, and
    // TensorPipe's CPU channels read and write it.
    return at::TensorOptions().device(c10::kCPU).pinned_memory(true);
  }
  void waitForSignal(int stream, Signal signal, uint32_t ticket) override {
    const RelaxedCapture relaxed(kRelaxed);
    signals_->wait(raw_[stream], signal, ticket);
  }
  void raiseSignal(Signal signal, uint32_t ticket) override {
    if (signals_) {
      signals_->raise(signal, ticket);
    }
  }
  void openSignals() override {
    if (signals_) {
      signals_->open();
    }
  }
  std::function<bool(const Fence&)> callerWaiter() override {
    if (!signals_) {
      return nullptr;
    }
    // Owns nothing of this: a Work may be waited on after its engine.
    return [device = device_](const Fence& fence) {
      const c10::cuda::CUDAStream caller =
          c10::cuda::getCurrentCUDAStream(device.index());
      if (captured(caller)) {
        return false; // a graph's wait would outlive this op
      }
      eventOf(fence).block(caller);
      return true;
    };
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

  static c10::Device checked(c10::Device device) {
    TORCH_CHECK(
        device.is_cuda() && device.has_index(),
        "fairring: the CUDA engine needs an indexed CUDA device, not ",
        device);
    return device;
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
  const bool highPriority_;
  const EngineStreams::Set raw_;
  // The rails' signals when the engine launches ahead; null: the host waits.
  const std::unique_ptr<CudaSignals> signals_;
};

} // namespace

std::unique_ptr<DeviceContext> makeCudaContext(
    c10::Device device, bool highPriority, bool streamHold) {
  return std::make_unique<StreamedContext>(
      std::make_unique<CudaStreams>(device, highPriority, streamHold));
}

bool cudaGraphCaptureUnderway(c10::Device device) {
  return device.is_cuda() &&
      CudaStreams::captured(c10::cuda::getCurrentCUDAStream(device.index()));
}

void relaxCaptureChecksOnThisThread() {
  if (c10::cuda::device_count() == 0) {
    return; // no CUDA context to be in: nothing can be captured
  }
  cudaStreamCaptureMode mode = kRelaxed;
  C10_CUDA_CHECK_WARN(cudaThreadExchangeStreamCaptureMode(&mode));
}

int64_t cudaMemoryInUse(c10::Device device) {
  const c10::cuda::CUDAGuard onDevice(device);
  size_t free = 0;
  size_t total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(total - free);
}

bool cudaPathBuilt() {
  return true;
}

std::string cudaRuntimeVersion() {
  return std::to_string(CUDART_VERSION / 1000) + "." +
      std::to_string(CUDART_VERSION % 1000 / 10);
}

} // namespace fairring
