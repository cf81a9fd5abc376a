#include <torch_headers.h> // first: the precompiled torch headers

#include "local/group_steps.h"

#include <algorithm>
#include <vector>

#include <c10/util/Exception.h>

#include "reduction.h"
#include "log.h"
#include "thread_name.h"

namespace fairring {

namespace {

// A Gloo step's own timeout: what is left of the op's time, so that it gives
// up by the op's deadline even where nothing aborts it. (A NCCL step is
// timed by its group's timeout, which setTimeout keeps past the engine's.)
std::chrono::milliseconds stepTimeout(LocalSteps::Clock::time_point deadline) {
  return std::max(
      std::chrono::milliseconds(1),
      std::chrono::ceil<std::chrono::milliseconds>(
          deadline - LocalSteps::Clock::now()));
}

} // namespace

GroupSteps::GroupSteps(
    c10::intrusive_ptr<c10d::Backend> reduceScatter,
    c10::intrusive_ptr<c10d::Backend> allGather)
    : reduceScatter_(std::move(reduceScatter)),
      allGather_(std::move(allGather)),
      waits_(std::make_shared<Waits>()) {}

GroupSteps::~GroupSteps() {
  join();
  if (abandonedStep_) {
    // A Gloo group waits for its step in flight before it is destroyed, until
    // the step's own timeout (the op's deadline) ends it: a detached thread
    // drops the groups, so that shutdown does not wait. It owns nothing else.
    std::thread([reduceScatter = std::move(reduceScatter_),
                 allGather = std::move(allGather_)]() mutable {
      reduceScatter.reset();
      allGather.reset();
    }).detach();
  }
}

bool GroupSteps::isNccl() const {
  return reduceScatter_->getBackendName() == "nccl";
}

void GroupSteps::reduceScatter(
    at::Tensor& slot,
    at::Tensor& parts,
    const at::Tensor& input,
    c10d::ReduceOp::RedOpType op,
    const LocalStepKey& /*key*/,
    Clock::time_point deadline) {
  std::vector<int64_t> equalSplits;
  c10d::AllToAllOptions options;
  options.timeout = stepTimeout(deadline);
  // NCCL runs a synchronous step on the caller's current stream, the stage's
  // own (docs/design.md, "Streams and fences"), not on a stream of its own.
  options.asyncOp = false;
  at::Tensor in = input;
  // The name both torch 2.11 and 2.15 have (2.15 also calls it
  // all_to_all_single).
  waitForStep(
      *reduceScatter_,
      reduceScatter_->alltoall_base(
          parts, in, equalSplits, equalSplits, options));
  for (int64_t part = 1; part < parts.size(0); ++part) {
    combineInto(slot, parts[part], op);
  }
}

void GroupSteps::allGather(
    at::Tensor& output,
    const at::Tensor& part,
    const LocalStepKey& /*key*/,
    Clock::time_point deadline) {
  c10d::AllgatherOptions options;
  options.timeout = stepTimeout(deadline);
  options.asyncOp = false;
  at::Tensor in = part;
  waitForStep(*allGather_, allGather_->_allgather_base(output, in, options));
}

std::string GroupSteps::name() const {
  return reduceScatter_->getBackendName();
}

void GroupSteps::waitForStep(
    const c10d::Backend& group, const c10::intrusive_ptr<c10d::Work>& work) {
  if (isNccl()) {
    if (work) {
      work->wait(); // the current stream waits, if it ran on another
    }
    return;
  }
  TORCH_CHECK(work, "the ", group.getBackendName(), " group returned no Work");
  auto waits = waits_;
  auto done = std::make_shared<bool>(false); // guarded by waits->mutex
  work->getFuture()->addCallback([waits, done](c10::ivalue::Future&) {
    std::lock_guard<std::mutex> lock(waits->mutex);
    *done = true;
    waits->changed.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(waits->mutex);
    waits->changed.wait(lock, [&] { return *done || waits->aborted; });
    if (!*done) {
      abandonedStep_ = true;
      TORCH_CHECK(false, "the engine stopped while the step was in flight");
    }
  }
  work->wait(); // done: rethrows the step's error, if any
}

void GroupSteps::setTimeout(std::chrono::milliseconds timeout) {
  if (isNccl()) {
    reduceScatter_->setTimeout(timeout + kNcclStepLag);
    allGather_->setTimeout(timeout + kNcclStepLag);
  }
}

void GroupSteps::abort() {
  if (stopped_.exchange(true)) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(waits_->mutex);
    waits_->aborted = true;
  }
  waits_->changed.notify_all();
  stopGroups(&c10d::Backend::abort);
}

void GroupSteps::close() {
  if (!isNccl()) {
    abort(); // Gloo flushes nothing; its steps are done on the host
    return;
  }
  if (!stopped_.exchange(true)) {
    stopGroups(&c10d::Backend::shutdown);
  }
}

void GroupSteps::stopGroups(void (c10d::Backend::*stop)()) {
  std::lock_guard<std::mutex> lock(waits_->mutex);
  waits_->stopsRunning = 2;
  for (const auto& group : {reduceScatter_, allGather_}) {
    stopping_.emplace_back([group, stop, waits = waits_] {
      nameThisThread("fr-group-stop");
      try {
        ((*group).*stop)();
      } catch (const std::exception&) {
        // Stopping is best effort: the engine has failed or is leaving.
      }
      {
        std::lock_guard<std::mutex> lock(waits->mutex);
        --waits->stopsRunning;
      }
      waits->changed.notify_all();
    });
  }
}

void GroupSteps::join() {
  std::vector<std::thread> stopping;
  bool stopped = false;
  {
    std::unique_lock<std::mutex> lock(waits_->mutex);
    stopping.swap(stopping_);
    stopped = waits_->changed.wait_for(
        lock, kStopWait, [this] { return waits_->stopsRunning == 0; });
  }
  if (stopping.empty()) {
    return;
  }
  for (auto& thread : stopping) {
    if (stopped) {
      thread.join();
    } else {
      thread.detach(); // it owns the group it stops and the waits
    }
  }
  if (!stopped) {
    notice(
        LogLevel::kWarning,
        c10::str(
            "fairring: a local ",
            reduceScatter_->getBackendName(),
            " group did not stop within ",
            kStopWait.count(),
            " s; leaving it to finish on its own"));
  }
}

} // namespace fairring
