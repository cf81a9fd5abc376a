#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "device/device.h"

namespace fairring {

// A Work for an operation whose outcome is `future`. Unlike the Work that
// c10d::Work::create_from_future makes, wait() rethrows the operation's error
// (that one returns as if the operation had succeeded) and honours a timeout.
// `profilingTitle` (a string literal, e.g. "fairring:all_reduce") names the
// operation in torch.profiler traces, from issue to completion, and in
// errors (null: no profiler range, errors name the op type); `seq` is its
// collective sequence number in the group. `holdCaller` (an engine op's on a
// device that can, Engine::Started): how wait() makes the caller's stream
// wait for the op on the device, the host not waiting.
class FutureWork final : public c10d::Work {
 public:
  FutureWork(
      c10::intrusive_ptr<c10::ivalue::Future> future,
      c10d::OpType opType,
      const char* profilingTitle,
      uint64_t seq,
      const std::vector<at::Tensor>& inputs,
      CallerHold holdCaller = nullptr);

  // Done, on the device too where it has one (failed: at once).
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // Throws the operation's error, or a timeout error naming the operation.
  // With CUDA tensors, the caller's current streams then wait for the
  // operation's; the host does not wait for the GPU. With a hold, an op not
  // yet done makes them wait for it on the device and returns at once: its
  // failure releases them and reaches the caller at its next wait or
  // collective, as NCCL's does.
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }
  uint64_t getSequencenumber() const override {
    return seq_;
  }

 private:
  // Ends c10d::Work's profiler range once, from whichever thread is first.
  class ProfilingRange {
   public:
    explicit ProfilingRange(std::function<void()> end) : end_(std::move(end)) {}
    void end();

   private:
    std::function<void()> end_;
    std::once_flag ended_;
  };

  // Where the operation ends on a device: once the future completed, an
  // event per device recorded on a stream that waits for the future's own,
  // so that isCompleted() means done on the device, as NCCL's Work does
  // (the future completes when the last work is launched).
  struct DeviceEnd {
    std::mutex mutex;
    bool recorded = false; // the future completed and its events are here
    std::vector<c10::Event> events;
  };

  const c10::intrusive_ptr<c10::ivalue::Future> future_;
  const std::shared_ptr<DeviceEnd> deviceEnd_; // null: no device
  const char* const title_;
  const uint64_t seq_;
  std::shared_ptr<ProfilingRange> profilingRange_; // null: no profiler
  const CallerHold holdCaller_; // null: the host waits for the future
};

// One Work standing for several (a coalescing block): it completes when all
// of them have and fails with the first failure. Gloo's point-to-point Works
// have no Future, so this waits on the Works themselves rather than on their
// futures. `seq`: the group's sequence number when the block ended.
class AllOfWork final : public c10d::Work {
 public:
  AllOfWork(std::vector<c10::intrusive_ptr<c10d::Work>> works, uint64_t seq);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // `timeout` bounds the whole wait, not each member's.
  bool wait(std::chrono::milliseconds timeout) override;
  void abort() override;
  uint64_t getSequencenumber() const override {
    return seq_;
  }

 private:
  const std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  const uint64_t seq_;
};

// A delegated collective whose launch waits for its turn in the engine's
// launch order (Engine::launchInTurn), handed out before it is launched: it
// stands for the delegate's Work once that exists. Its future is its own,
// made now (DDP chains on it at once), which whoever launches it completes
// as the delegate's completes (Engine::completeOnWorkers); wait() first
// waits on the host for the launch, then as the delegate's Work does;
// is_completed() is false until the launch.
class InTurnWork final : public c10d::Work {
 public:
  InTurnWork(
      c10d::OpType opType, std::vector<c10::Device> devices, uint64_t seq);

  // Where its turn came (a stage thread, or the caller's): the delegate's
  // launched Work, or the error that kept it from launching. Neither
  // completes the future.
  void launched(c10::intrusive_ptr<c10d::Work> inner);
  void failed(std::exception_ptr error);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // Throws the error that kept it from launching, or a timeout error where
  // it was not launched within `timeout`.
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }
  uint64_t getSequencenumber() const override {
    return seq_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable settled_;
  c10::intrusive_ptr<c10d::Work> inner_; // once launched
  std::exception_ptr error_; // never launched
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
  const uint64_t seq_;
};

// A Work that is `inner` in every respect a subclass does not override, but
// its future: Work's own (none) unless the subclass gives one.
class ForwardingWork : public c10d::Work {
 public:
  explicit ForwardingWork(c10::intrusive_ptr<c10d::Work> inner);

  bool isCompleted() override {
    return inner_->isCompleted();
  }
  bool isSuccess() const override {
    return inner_->isSuccess();
  }
  std::exception_ptr exception() const override {
    return inner_->exception();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    return inner_->wait(timeout);
  }
  std::vector<at::Tensor> result() override {
    return inner_->result();
  }
  void synchronize() override {
    inner_->synchronize();
  }
  void abort() override {
    inner_->abort();
  }
  int sourceRank() const override {
    return inner_->sourceRank();
  }
  uint64_t getSequencenumber() const override {
    return inner_->getSequencenumber();
  }

 protected:
  const c10::intrusive_ptr<c10d::Work> inner_;
};

// A delegate's Work whose operation ends inside wait() and that has no
// future to say when: Gloo's reduce_scatter_tensor all-reduces a copy of the
// input, and its wait() copies this rank's chunk into the output, again on
// every call, while is_completed() never says true. This one is completed
// once a wait has succeeded, and later waits return at once: fairring's
// memory order and its hooks' poller ask every Work they hold whether it is
// done, and a second wait would copy a stale result over what the caller
// wrote into the output since.
class CompletedByWaitWork final : public ForwardingWork {
 public:
  using ForwardingWork::ForwardingWork;

  bool isCompleted() override {
    return waited_ || inner_->isCompleted();
  }
  bool isSuccess() const override {
    return waited_ || inner_->isSuccess();
  }
  // One wait at a time runs the inner one; it throws as that one does.
  bool wait(std::chrono::milliseconds timeout) override;

 private:
  std::mutex waiting_;
  std::atomic<bool> waited_{false};
};

// A Work launched during graph capture, as fairring hands it out. Its
// completion is an event recorded into the graph, which no thread may query
// (device/capture.h), and torch's flight recorder asks every Work it sees
// whether it is done: isCompleted() says false without asking. Everything
// else is the launched Work's: wait() makes the current stream wait for it
// within the capture; its future is the delegate's.
class CapturedWork final : public ForwardingWork {
 public:
  using ForwardingWork::ForwardingWork;

  bool isCompleted() override {
    return false; // the graph runs it later, when replayed
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return inner_->getFuture();
  }
};

// The tests' model of a Work that NCCL returns during graph capture
// (CaptureModel, device/capture.h): its completion is an event recorded into
// the graph, so isCompleted() records a violation (on CUDA it would
// invalidate the capture) before it answers; and it has no host future, so
// that a consumer that would poll it (the hooks' poller) polls it. wait() is
// legal (on CUDA, the current stream waits for it within the capture).
class ModelCapturedWork final : public ForwardingWork {
 public:
  using ForwardingWork::ForwardingWork;

  bool isCompleted() override;
};

} // namespace fairring
