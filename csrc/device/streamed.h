#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "device/device.h"

namespace fairring {

// The streams of a device that orders its work on streams, as CUDA does, and
// what the engine's ordering needs of them. Two implement it: CUDA
// (device/cuda.cpp, the only code that sees CUDA headers) and the emulated
// device the tests run on the CPU (device/emulated.h), so the ordering
// StreamedContext decides is the same code on both.
//
// The policy creates and owns its streams, numbered by StreamPolicy::Stream;
// nothing else issues work on them.
class StreamPolicy {
 public:
  enum Stream : int {
    kInputStream = 0, // Queue::kInput's
    kReduceStream = 1, // Queue::kReduce's
    kOutputStream = 2, // Queue::kOutput's
    kSendStream = 3, // the rails' copies out of device memory, nothing else
    kReceiveStream = 4, // the rails' copies into device memory, nothing else
  };
  static constexpr int kStreams = 5;

  virtual ~StreamPolicy() = default;

  virtual c10::Device device() const = 0;
  virtual std::vector<c10::Device> futureDevices() const = 0;
  virtual int64_t minShardBytes() const = 0;
  // DeviceContext::mayRunInLaunchOrder.
  virtual bool mayRunInLaunchOrder() const = 0;

  // Caller's thread: the caller's work so far, on its current stream.
  virtual Fence recordCaller() = 0;
  // `work` (which launches device work from the host) lands on `stream`,
  // after what was issued there before. It does not throw. `issuer`: the
  // queue whose stage thread issues it.
  virtual void issue(int stream, Queue issuer, std::function<void()> work) = 0;
  virtual Fence record(int stream) = 0;
  // `stream`'s later work waits for `fence`; the host does not.
  virtual void wait(int stream, const Fence& fence) = 0;
  // Whether the work before `fence` is done; true for an empty fence.
  virtual bool query(const Fence& fence) = 0;
  // `tensor`'s memory is not reused before `stream`'s work so far is done.
  virtual void recordUse(const at::Tensor& tensor, int stream) = 0;

  // The rails' view of `tensor` on the send or the receive stream, and what
  // the receive stream records once a receive into `received` completed
  // (transport thread).
  virtual rails::Buffer sendBuffer(const at::Tensor& tensor) = 0;
  virtual rails::Buffer receiveBuffer(const at::Tensor& tensor) = 0;
  virtual Fence received(const rails::Buffer& received) = 0;

  // DeviceContext's launching ahead (waitForSignal on `stream`); by default
  // the device does not.
  virtual bool launchesAhead() const {
    return false;
  }
  virtual at::TensorOptions railsMemoryOptions() const = 0;
  virtual void waitForSignal(
      int /*stream*/, Signal /*signal*/, uint32_t /*ticket*/) {}
  virtual void raiseSignal(Signal /*signal*/, uint32_t /*ticket*/) {}
  virtual void openSignals() {}
  virtual std::function<bool(const Fence&)> callerWaiter() {
    return nullptr;
  }
  // What a copy from the rails' memory takes beyond its bytes: nothing but
  // on the emulated device, where tests slow it (receive_delay_ms).
  virtual std::chrono::milliseconds receivedCopyDelay() const {
    return std::chrono::milliseconds(0);
  }

  // Queued work is dropped and device-side waits end (any thread); then the
  // policy's own threads, if any, are joined.
  virtual void abort() {}
  virtual void join() {}
};

// DeviceContext on a device with streams: which stream each piece of work
// goes on, which fences it records and waits for, what memory is kept alive
// on which streams. Each queue's work goes on its own stream, in slice
// order, fed by that stage's thread only; the rails' copies go on the send
// and receive streams.
class StreamedContext final : public DeviceContext {
 public:
  explicit StreamedContext(std::unique_ptr<StreamPolicy> policy);
  ~StreamedContext() override;

  Fence adoptInput(
      const at::Tensor& elements, const at::Tensor& tensor) override;
  std::vector<c10::Device> futureDevices() const override;
  void enqueue(Queue queue, std::function<void()> work) override;
  void waitOnDevice(Queue queue, const Fence& fence) override;
  Fence record(Queue queue) override;
  bool fenceDone(const Fence& fence) override;
  bool waitOnHost(
      const Fence& fence, const std::function<bool()>& cancelled) override;
  at::TensorOptions memoryOptions() const override;
  void adoptStaging(const at::Tensor& staging) override;
  rails::Buffer sendBuffer(const at::Tensor& tensor) override;
  rails::Buffer receiveBuffer(const at::Tensor& tensor) override;
  bool launchesAhead() const override;
  at::TensorOptions railsMemoryOptions() const override;
  void waitForSignal(Queue queue, Signal signal, uint32_t ticket) override;
  void raiseSignal(Signal signal, uint32_t ticket) override;
  void openSignals() override;
  void railsCopy(
      Queue queue,
      const at::Tensor& to,
      const at::Tensor& from,
      bool received) override;
  std::function<bool(const Fence&)> callerWaiter() override;
  Fence receivedFence(const rails::Buffer& received) override;
  int64_t minShardBytes() const override;
  bool mayRunInLaunchOrder() const override;
  void abort() override;
  void join() override;

 private:
  static int streamOf(Queue queue) {
    return static_cast<int>(queue); // numbered alike
  }

  const std::unique_ptr<StreamPolicy> policy_;
};

} // namespace fairring
