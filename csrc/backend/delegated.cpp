#include "backend/delegated.h"

#include <atomic>

#include <c10/util/Exception.h>

#include "backend/work.h"

namespace fairring {

struct DelegatedWorks::Watched {
  c10d::OpType opType;
  c10::intrusive_ptr<c10::ivalue::Future> outer;
  std::atomic<bool> settled{false};

  void complete(c10::ivalue::Future& inner) {
    if (settled.exchange(true)) {
      return;
    }
    if (inner.hasError()) {
      outer->setError(inner.exception_ptr());
    } else {
      outer->markCompleted(inner.constValue());
    }
  }
  void fail(const std::string& message) {
    if (!settled.exchange(true)) {
      outer->setError(std::make_exception_ptr(std::runtime_error(message)));
    }
  }
};

DelegatedWorks::~DelegatedWorks() {
  if (!failing_.joinable()) {
    return;
  }
  // A callback of a work it failed may have dropped the last reference to
  // the backend; the thread uses nothing of this object's.
  if (failing_.get_id() == std::this_thread::get_id()) {
    failing_.detach();
  } else {
    failing_.join();
  }
}

c10::intrusive_ptr<c10d::Work> DelegatedWorks::watch(
    const c10::intrusive_ptr<c10d::Work>& inner,
    c10d::OpType opType,
    uint64_t seq,
    const std::vector<at::Tensor>& inputs) {
  c10::intrusive_ptr<c10::ivalue::Future> innerFuture;
  try {
    innerFuture = inner->getFuture();
  } catch (const c10::Error&) {
    return inner; // some of Gloo's Works have none: left to Gloo's timeout
  }
  auto watched = std::make_shared<Watched>();
  watched->opType = opType;
  watched->outer = c10::make_intrusive<c10::ivalue::Future>(
      innerFuture->elementType(), innerFuture->devices());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_.size() >= pruneAt_) {
      std::erase_if(pending_, [](const auto& weak) { return weak.expired(); });
      pruneAt_ = std::max<size_t>(64, 2 * pending_.size());
    }
    pending_.push_back(watched);
  }
  // Runs on the delegate's thread that completes the operation (or here).
  innerFuture->addCallback(
      [watched](c10::ivalue::Future& done) { watched->complete(done); });
  // Gloo's Work already records the profiler range.
  return c10::make_intrusive<FutureWork>(
      watched->outer, opType, nullptr, seq, inputs);
}

void DelegatedWorks::fail(const std::string& cause) {
  std::vector<std::shared_ptr<Watched>> failing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) {
      return;
    }
    failure_ = cause;
    for (const auto& weak : pending_) {
      if (auto watched = weak.lock()) {
        failing.push_back(std::move(watched));
      }
    }
    pending_.clear();
    // The first and only failure: a thread of this object's runs the
    // callbacks of the works it fails.
    failing_ =
        std::thread([failing = std::move(failing), cause, prefix = prefix_] {
          for (const auto& watched : failing) {
            watched->fail(
                prefix + c10d::opTypeToString(watched->opType) +
                " failed: " + cause);
          }
        });
  }
}

std::string DelegatedWorks::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

} // namespace fairring
