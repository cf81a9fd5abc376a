#include <torch_headers.h> // first: the precompiled torch headers

#include "backend/delegated.h"

#include <atomic>

#include <c10/util/Exception.h>

#include "backend/work.h"
#include "errors.h"
#include "log.h"
#include "reduction.h"
#include "thread_name.h"

namespace fairring {

namespace {

std::atomic<bool> completedByWaitEnabled{true};
std::atomic<bool> askedForWork{true};

} // namespace

bool delegatesAskedForWork() {
  return askedForWork;
}

void setDelegatesAskedForWorkForTests(bool enabled) {
  askedForWork = enabled;
}

void DelegatedWorks::setCompletedByWaitForTests(bool enabled) {
  completedByWaitEnabled = enabled;
}

struct DelegatedWorks::Watched {
  c10d::OpType opType;
  c10::intrusive_ptr<c10::ivalue::Future> outer;
  std::shared_ptr<std::atomic<c10d::ErrorType>> ownError;
  std::atomic<bool> settled{false};

  void complete(c10::ivalue::Future& inner) {
    if (settled.exchange(true)) {
      return;
    }
    if (inner.hasError()) {
      // Gloo's timeouts say "Timed out"; its other errors are its transport's.
      const bool timedOut =
          inner.tryRetrieveErrorMessage().find("imed out") != std::string::npos;
      auto none = c10d::ErrorType::SUCCESS;
      ownError->compare_exchange_strong(
          none,
          timedOut ? c10d::ErrorType::TIMEOUT : c10d::ErrorType::COMM_ERROR);
      outer->setError(inner.exception_ptr());
    } else {
      outer->markCompleted(inner.constValue());
    }
  }
  void fail(const std::string& message) {
    if (!settled.exchange(true)) {
      outer->setError(distError(ErrorClass::kBackend, message));
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
    // Some of Gloo's Works have none: left to Gloo's timeout. Those of its
    // collectives end in wait() (CompletedByWaitWork says why).
    if (!completedByWaitEnabled) {
      return inner;
    }
    return c10::make_intrusive<CompletedByWaitWork>(inner);
  }
  auto watched = std::make_shared<Watched>();
  watched->opType = opType;
  watched->ownError = ownError_;
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

void DelegatedWorks::fail(
    const std::string& cause, std::function<void()> andThen) {
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
    failing_ = std::thread([failing = std::move(failing),
                            cause,
                            prefix = prefix_,
                            andThen = std::move(andThen)] {
      nameThisThread("fr-fail-works");
      for (const auto& watched : failing) {
        watched->fail(
            prefix + c10d::opTypeToString(watched->opType) +
            " failed: " + cause);
      }
      if (andThen) {
        try {
          andThen();
        } catch (const std::exception& error) {
          notice(
              LogLevel::kWarning,
              c10::str(prefix, "after a failure: ", error.what()));
        }
      }
    });
  }
}

std::string DelegatedWorks::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

// Gloo, which serves CPU tensors, has no PREMUL_SUM and cannot average
// integers; say so up front instead of failing inside Gloo. (all_reduce and
// the reduce-scatters turn PREMUL_SUM into a SUM first: backend/premul.h.)
void checkGlooReduction(
    const char* opName,
    const c10d::ReduceOp& op,
    const std::vector<at::Tensor>& tensors) {
  for (const auto& tensor : tensors) {
    const at::ScalarType dtype = tensor.scalar_type();
    // Gloo reduces what the engine does, and bool and complex64/128.
    const bool glooReduces = reducibleDtype(dtype) || dtype == at::kBool ||
        dtype == at::kComplexFloat || dtype == at::kComplexDouble;
    TORCH_CHECK(
        glooReduces,
        "fairring: ",
        opName,
        " of ",
        dtype,
        " CPU tensors is not supported (Gloo reduces float32, float64, "
        "float16, bfloat16, int8, uint8, int32, int64, bool and complex); "
        "convert the tensor first, e.g. to ",
        at::isFloatingType(dtype) ? "float32" : "int64");
  }
  TORCH_CHECK(
      op != c10d::ReduceOp::PREMUL_SUM,
      "fairring: ",
      opName,
      " with ReduceOp.PREMUL_SUM is not supported for CPU tensors (all_reduce "
      "and reduce_scatter support it); scale the tensor and use ReduceOp.SUM");
  if (op != c10d::ReduceOp::AVG) {
    return;
  }
  for (const auto& tensor : tensors) {
    TORCH_CHECK(
        at::isFloatingType(tensor.scalar_type()),
        "fairring: ",
        opName,
        " with ReduceOp.AVG needs a floating-point tensor, got ",
        tensor.scalar_type(),
        "; use ReduceOp.SUM and divide by the group size");
  }
}

} // namespace fairring
