#include "work.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include "device/capture.h"

namespace fairring {

FutureWork::FutureWork(
    c10::intrusive_ptr<c10::ivalue::Future> future,
    c10d::OpType opType,
    const char* profilingTitle,
    uint64_t seq,
    const std::vector<at::Tensor>& inputs,
    CallerHold holdCaller)
    : c10d::Work(-1, opType, profilingTitle, inputs),
      future_(std::move(future)),
      deviceEnd_(
          future_->devices().empty() ? nullptr : std::make_shared<DeviceEnd>()),
      title_(profilingTitle),
      seq_(seq),
      holdCaller_(std::move(holdCaller)) {
  if (deviceEnd_) {
    // A future's callback runs with a current stream per device that waits
    // for the future's events: an event recorded there marks their end.
    future_->addCallback([end = deviceEnd_](c10::ivalue::Future& done) {
      std::vector<c10::Event> events;
      if (!done.hasError()) {
        for (const c10::Device& device : done.devices()) {
          const c10::impl::VirtualGuardImpl impl(device.type());
          events.emplace_back(device.type());
          events.back().record(impl.getStream(device));
        }
      }
      std::lock_guard<std::mutex> lock(end->mutex);
      end->events = std::move(events);
      end->recorded = true;
    });
  }
  // c10d::Work opened a profiler range if a profiler is on; it ends when
  // the operation does: in the future's callback, or in wait() if that
  // wakes first (a profiler stopped right after wait() still sees it end).
  if (recordFunctionEndCallback_) {
    profilingRange_ =
        std::make_shared<ProfilingRange>(std::move(recordFunctionEndCallback_));
    recordFunctionEndCallback_ = nullptr;
    future_->addCallback(
        [range = profilingRange_](c10::ivalue::Future&) { range->end(); });
  }
}

void FutureWork::ProfilingRange::end() {
  std::call_once(ended_, end_);
}

bool FutureWork::isCompleted() {
  if (!future_->completed()) {
    return false;
  }
  if (!deviceEnd_) {
    return true;
  }
  std::lock_guard<std::mutex> lock(deviceEnd_->mutex);
  return deviceEnd_->recorded &&
      std::all_of(
             deviceEnd_->events.begin(),
             deviceEnd_->events.end(),
             [](const c10::Event& event) { return event.query(); });
}

bool FutureWork::isSuccess() const {
  return future_->completed() && !future_->hasError();
}

std::exception_ptr FutureWork::exception() const {
  return future_->completed() && future_->hasError() ? future_->exception_ptr()
                                                     : nullptr;
}

bool FutureWork::wait(std::chrono::milliseconds timeout) {
  // Not done: the caller's stream waits for it on the device, and the host
  // goes on (docs/design.md, "The host never waits"). The op's own timeout
  // bounds that wait, as NCCL's watchdog bounds its kernels'. Settled (its
  // ticket released) but its future not yet relayed: the host waits below.
  if (holdCaller_ && !future_->completed() && holdCaller_()) {
    return true;
  }
  if (timeout != kNoTimeout) {
    struct Signal {
      std::mutex mutex;
      std::condition_variable done;
      bool completed = false;
    };
    auto signal = std::make_shared<Signal>();
    // Runs inline if already complete, else on the completing thread.
    future_->addCallback([signal](c10::ivalue::Future&) {
      std::lock_guard<std::mutex> lock(signal->mutex);
      signal->completed = true;
      signal->done.notify_all();
    });
    std::unique_lock<std::mutex> lock(signal->mutex);
    TORCH_CHECK_WITH(
        DistBackendError,
        signal->done.wait_for(lock, timeout, [&] { return signal->completed; }),
        // "fairring:all_reduce", ...; a delegated one has no title of ours
        title_ != nullptr ? std::string(title_)
                          : c10d::opTypeToString(retrieveOpType()),
        " did not complete within ",
        timeout.count(),
        " ms");
  }
  // Also orders the caller's current CUDA streams after the operation, as
  // NCCL's wait() does; on the CPU it only waits.
  future_->wait();
  if (profilingRange_) {
    profilingRange_->end();
  }
  if (future_->hasError()) {
    std::rethrow_exception(future_->exception_ptr());
  }
  return true;
}

std::vector<at::Tensor> FutureWork::result() {
  return future_->value().toTensorVector();
}

AllOfWork::AllOfWork(
    std::vector<c10::intrusive_ptr<c10d::Work>> works, uint64_t seq)
    : c10d::Work(-1, c10d::OpType::COALESCED),
      works_(std::move(works)),
      seq_(seq) {}

bool AllOfWork::isCompleted() {
  return std::all_of(works_.begin(), works_.end(), [](const auto& work) {
    return work->isCompleted();
  });
}

bool AllOfWork::isSuccess() const {
  return exception() == nullptr;
}

std::exception_ptr AllOfWork::exception() const {
  for (const auto& work : works_) {
    if (work->isCompleted() && !work->isSuccess()) {
      return work->exception();
    }
  }
  return nullptr;
}

bool AllOfWork::wait(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const bool bounded = timeout != kNoTimeout;
  const auto deadline = Clock::now() + timeout;
  for (const auto& work : works_) {
    auto remaining = timeout;
    if (bounded) {
      remaining = std::max(
          std::chrono::milliseconds(0),
          std::chrono::duration_cast<std::chrono::milliseconds>(
              deadline - Clock::now()));
    }
    work->wait(remaining);
  }
  return true;
}

void AllOfWork::abort() {
  for (const auto& work : works_) {
    work->abort();
  }
}

InTurnWork::InTurnWork(
    c10d::OpType opType, std::vector<c10::Device> devices, uint64_t seq)
    : c10d::Work(-1, opType),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get()),
              std::move(devices))),
      seq_(seq) {}

void InTurnWork::launched(c10::intrusive_ptr<c10d::Work> inner) {
  TORCH_CHECK(inner, "fairring: the delegate launched no Work");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inner_ = std::move(inner);
  }
  settled_.notify_all();
}

void InTurnWork::failed(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (inner_ || error_) {
      return;
    }
    error_ = std::move(error);
  }
  settled_.notify_all();
}

bool InTurnWork::isCompleted() {
  c10::intrusive_ptr<c10d::Work> inner;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) {
      return true;
    }
    inner = inner_;
  }
  return inner && inner->isCompleted();
}

bool InTurnWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !error_ && inner_ && inner_->isSuccess();
}

std::exception_ptr InTurnWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_ ? error_ : inner_ ? inner_->exception() : nullptr;
}

bool InTurnWork::wait(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  c10::intrusive_ptr<c10d::Work> inner;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto settled = [this] { return inner_ || error_; };
    if (timeout == kNoTimeout) {
      settled_.wait(lock, settled);
    } else {
      TORCH_CHECK_WITH(
          DistBackendError,
          settled_.wait_for(lock, timeout, settled),
          c10d::opTypeToString(retrieveOpType()),
          " was not launched within ",
          timeout.count(),
          " ms: it waits for the engine's launches of the ops issued before "
          "it");
    }
    if (error_) {
      std::rethrow_exception(error_);
    }
    inner = inner_;
  }
  if (timeout == kNoTimeout) {
    return inner->wait(timeout);
  }
  return inner->wait(
      std::max(
          std::chrono::milliseconds(0),
          timeout -
              std::chrono::duration_cast<std::chrono::milliseconds>(
                  Clock::now() - started)));
}

std::vector<at::Tensor> InTurnWork::result() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(inner_, "fairring: this operation has not been launched");
  return inner_->result();
}

void InTurnWork::abort() {
  c10::intrusive_ptr<c10d::Work> inner;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inner = inner_;
  }
  if (inner) {
    inner->abort();
  }
}

ForwardingWork::ForwardingWork(c10::intrusive_ptr<c10d::Work> inner)
    : c10d::Work(-1, inner->retrieveOpType()), inner_(std::move(inner)) {}

bool CompletedByWaitWork::wait(std::chrono::milliseconds timeout) {
  if (waited_) {
    return true;
  }
  std::lock_guard<std::mutex> lock(waiting_);
  if (!waited_) {
    inner_->wait(timeout);
    waited_ = true;
  }
  return true;
}

bool ModelCapturedWork::isCompleted() {
  CaptureModel::violated(
      std::string("a Work issued during graph capture was queried (") +
      c10d::opTypeToString(retrieveOpType()) + ")");
  return inner_->isCompleted();
}

} // namespace fairring
