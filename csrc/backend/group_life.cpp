#include <torch_headers.h> // first: the precompiled torch headers

// A group's life after it is made: its timeout, eager connection at init,
// split_group and shrink_group, failure (getError, refusal), torch's
// completion and abort hooks, and abort and shutdown.

#include "backend/backend.h"
#include "log.h"

#include <algorithm>
#include <atomic>
#include <functional>

#include <c10/util/Exception.h>

namespace fairring {

namespace {

// Backend::setDelegateAbortedOnFailureForTests.
std::atomic<bool> delegateAbortedOnFailure{true};

} // namespace

void Backend::onEngineFailed(
    const std::string& cause, Engine::FailureKind kind) {
  if (leaving_) {
    // abort() or shutdown() stops the delegate itself, as it was asked to.
    torchHooks_.runAbortHooks();
    delegated_.fail(cause);
    return;
  }
  const auto type = kind == Engine::FailureKind::kTimeout
      ? c10d::ErrorType::TIMEOUT
      : kind == Engine::FailureKind::kRemote ? c10d::ErrorType::REMOTE_ERROR
                                             : c10d::ErrorType::COMM_ERROR;
  auto none = c10d::ErrorType::SUCCESS;
  failureKind_.compare_exchange_strong(none, type);
  torchHooks_.runAbortHooks();
  // The CUDA delegate's kernels launched before the failure may wait on a
  // rank whose matching launch never came (its in-turn launch failed):
  // NCCL's abort ends them now, as its watchdog would only after the
  // group's timeout. The group takes no delegated collective after this
  // (checkNotFailed), so nothing is lost, and a group with an engine (as
  // this one) makes a new communicator when it shrinks. Aborted on
  // DelegatedWorks' thread, not this engine thread: ncclCommAbort can block
  // while kernels spin.
  std::function<void()> abortDelegate;
  if (auto cuda = cudaBackendIfCreated(); cuda && delegateAbortedOnFailure) {
    abortDelegate = [cuda] { cuda->abort(); };
  }
  delegated_.fail(cause, std::move(abortDelegate));
}

void Backend::setDelegateAbortedOnFailureForTests(bool enabled) {
  delegateAbortedOnFailure = enabled;
}

void Backend::adoptCudaDelegateForTests(
    c10::intrusive_ptr<c10d::Backend> delegate) {
  std::lock_guard<std::mutex> lock(stateMutex_);
  cudaBackend_ = std::move(delegate);
}

c10d::ErrorType Backend::getError() {
  if (const auto kind = failureKind_.load(); kind != c10d::ErrorType::SUCCESS) {
    return kind;
  }
  if (const auto kind = delegated_.ownError();
      kind != c10d::ErrorType::SUCCESS) {
    return kind;
  }
  if (auto cuda = cudaBackendIfCreated()) {
    return cuda->getError(); // NCCL classes its own
  }
  return c10d::ErrorType::SUCCESS;
}

void Backend::checkNotFailed(const char* opName) const {
  const std::string failure = delegated_.failure();
  TORCH_CHECK_WITH(
      DistBackendError,
      failure.empty(),
      "fairring: rank ",
      getRank(),
      ": ",
      opName,
      " not started: an earlier failure stopped the process group: ",
      failure);
}

#if FAIRRING_HAS_BACKEND_HOOKS
void Backend::registerCompletionHook(int64_t id, c10d::CompletionHook hook) {
  torchHooks_.addCompletionHook(
      id,
      [hook = std::move(hook)](uint64_t key, std::optional<float> durationMs) {
        c10d::CompletionHookArgs args;
        args.completionKey = key;
        args.duration_ms = durationMs;
        hook(args);
      });
}

void Backend::unregisterCompletionHook(int64_t id) {
  torchHooks_.removeCompletionHook(id);
}

void Backend::registerAbortHook(int64_t id, c10d::AbortHook hook) {
  torchHooks_.addAbortHook(id, std::move(hook));
}

void Backend::unregisterAbortHook(int64_t id) {
  torchHooks_.removeAbortHook(id);
}
#endif

void Backend::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  cpuBackend_->setTimeout(timeout);
  if (auto cuda = cudaBackendIfCreated()) {
    cuda->setTimeout(timeout);
  }
  forEachEngine([timeout](Engine& engine) { engine.setTimeout(timeout); });
}

std::vector<std::string> Backend::pending() const {
  // The destructor first unlists this backend, waiting for the report that
  // called this: no lock is held while an engine reports (its failure
  // callbacks may take stateMutex_).
  std::vector<std::string> lines;
  for (const Engine* engine : madeEngines()) {
    if (engine == nullptr) {
      continue;
    }
    for (auto& line : engine->pending()) {
      lines.push_back("group " + getGroupUid() + ": " + std::move(line));
    }
  }
  return lines;
}

void Backend::eagerConnectSingleDevice(at::Device device) {
  if (!device.is_cuda()) {
    return; // the CPU delegate, Gloo, is connected when the group is made
  }
  if (!getBoundDeviceId()) {
    setBoundDeviceId(device); // cudaBackend() binds the delegate to it
  }
  cudaBackend().eagerConnectSingleDevice(device);
  prepareEngine(device);
}

c10::intrusive_ptr<c10d::Backend::Options> Backend::getBackendOptions() {
  // A fresh copy each time: split_group edits what it is given.
  return c10::make_intrusive<Options>(getBackendName(), timeout());
}

c10::intrusive_ptr<c10d::Backend> Backend::split(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  if (std::find(ranks.begin(), ranks.end(), getRank()) == ranks.end()) {
    return nullptr; // not a member; the members need nothing from this rank
  }
  const std::string name = opts ? opts->group_name : std::string();
  const auto timeout = opts ? opts->timeout : this->timeout();
  std::lock_guard<std::mutex> creating(creationMutex_);
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    if (auto it = splits_.find(name); it != splits_.end()) {
      if (auto made = it->second.lock()) {
        return made;
      }
    }
  }
  auto made = innerGroups_->split(store, ranks, timeout, name);
  TORCH_CHECK(made, "fairring: split_group made no backend");
  std::lock_guard<std::mutex> lock(stateMutex_);
  std::erase_if(
      splits_, [](const auto& entry) { return entry.second.expired(); });
  splits_.insert_or_assign(name, c10::weak_intrusive_ptr<c10d::Backend>(made));
  return made;
}

namespace {

// c10d's shrink flags (torch.distributed.distributed_c10d.SHRINK_*).
constexpr int kShrinkDefault = 0;
constexpr int kShrinkAbort = 1;

// The ranks of a group of `size` that remain once `excluded` leave, sorted;
// throws, saying what to pass, unless `excluded` names at least one rank of
// the group, each once, neither `self` nor every rank.
std::vector<int> survivorsAfter(
    const std::vector<int64_t>& excluded, int self, int size) {
  TORCH_CHECK_VALUE(
      !excluded.empty(),
      "fairring: shrink needs at least one rank to exclude; pass the failed "
      "ranks, e.g. [3]");
  std::vector<bool> leaves(size, false);
  for (const int64_t rank : excluded) {
    TORCH_CHECK_VALUE(
        rank >= 0 && rank < size,
        "fairring: cannot exclude rank ",
        rank,
        ": the group has ranks 0 to ",
        size - 1,
        " (ranks_to_exclude are ranks of the group being shrunk)");
    TORCH_CHECK_VALUE(
        !leaves[rank], "fairring: rank ", rank, " is excluded twice");
    leaves[rank] = true;
  }
  TORCH_CHECK_VALUE(
      std::find(leaves.begin(), leaves.end(), false) != leaves.end(),
      "fairring: cannot exclude all ",
      size,
      " ranks of the group: at least one must remain");
  TORCH_CHECK_VALUE(
      !leaves[self],
      "fairring: rank ",
      self,
      " excludes itself from the group it shrinks; only the ranks that "
      "remain call shrink_group, and an excluded rank leaves the job");
  std::vector<int> survivors;
  for (int rank = 0; rank < size; ++rank) {
    if (!leaves[rank]) {
      survivors.push_back(rank);
    }
  }
  return survivors; // never empty: it holds `self`
}

} // namespace

c10::intrusive_ptr<c10d::Backend> Backend::shrink(
    const std::vector<int64_t>& ranksToExclude,
    int shrinkFlags,
    const c10::intrusive_ptr<Options>& optsOverride) {
  const std::vector<int> survivors =
      survivorsAfter(ranksToExclude, getRank(), getSize());
  TORCH_CHECK_VALUE(
      shrinkFlags == kShrinkDefault || shrinkFlags == kShrinkAbort,
      "fairring: shrink_flags must be SHRINK_DEFAULT (0) or SHRINK_ABORT (1), "
      "not ",
      shrinkFlags);
  std::vector<int64_t> sorted = ranksToExclude;
  std::sort(sorted.begin(), sorted.end());
  std::string excluded; // the same text on every survivor
  for (const int64_t rank : sorted) {
    excluded += (excluded.empty() ? "" : "-") + std::to_string(rank);
  }
  if (shrinkFlags == kShrinkAbort) {
    // This group's pending ops end now; the survivors' own aborts end theirs.
    // Its own doing, as abort() is: no failure class, no dump.
    leaving_ = true;
    torchHooks_.quiet();
    stopEngines("shrank its process group (SHRINK_ABORT)", /*drain=*/false);
    delegated_.fail(
        topology_.describeRank(getRank()) +
        " shrank its process group (SHRINK_ABORT)");
  }
  std::lock_guard<std::mutex> creating(creationMutex_);
  // NCCL shrinks its own communicator (ncclCommShrink, NCCL >= 2.27),
  // collectively over the survivors, which reach this point in the same
  // order. Where it cannot, the old one is aborted (a rank of it is gone)
  // and the shrunk group makes a new one at its first CUDA collective; so
  // too where the group has an engine, whose failure may have aborted it on
  // some ranks (onEngineFailed): whether a group has made an engine is the
  // same on every rank (made at one collective), so the survivors all take
  // one way.
  c10::intrusive_ptr<c10d::Backend> cuda;
  if (auto made = cudaBackendIfCreated()) {
    if (anyEngineMade()) {
      innerGroups_->noticeOnce(
          "a group with an engine makes a new NCCL communicator when it "
          "shrinks (its failure may have aborted the old one): at the "
          "shrunk group's first CUDA collective");
      made->abort();
    } else if (made->supportsShrinking()) {
      cuda = made->shrink(ranksToExclude, shrinkFlags, nullptr);
    } else {
      innerGroups_->noticeOnce(
          "the NCCL in use cannot shrink a communicator (ncclCommShrink needs "
          "NCCL 2.27): a shrunk group makes a new NCCL communicator at its "
          "first CUDA collective");
      made->abort();
    }
  }
  int generation = 0;
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    generation = shrinks_++;
  }
  const auto timeout = optsOverride && optsOverride->timeout.count() > 0
      ? optsOverride->timeout
      : this->timeout();
  auto made = innerGroups_->shrink(
      survivors,
      timeout,
      std::to_string(generation) + "/without-" + excluded,
      std::move(cuda));
  TORCH_CHECK(made, "fairring: shrink made no backend");
  return made;
}

void Backend::awaitDumps() {
  // c10d drops the group's flight recorder hook once this returns, and a
  // dump that has not begun by then writes nothing.
  if (!awaitFailureReports(kDumpWait)) {
    notice(
        LogLevel::kWarning,
        c10::str(
            "fairring: the group goes while a dump of its failure still runs "
            "after ",
            kDumpWait.count(),
            " s; the dump may be incomplete"));
  }
}

void Backend::stopEngines(const std::string& did, bool drain) {
  forEachEngine([&](Engine& engine) {
    if (drain) {
      engine.leave(did);
    } else {
      engine.abort(did);
    }
  });
}

void Backend::abort() {
  leaving_ = true;
  torchHooks_.quiet();
  // Everything pending ends first, at once, as NCCL's abort ends its
  // kernels; then a dump that an earlier failure started gets its time.
  stopEngines("aborted its process group", /*drain=*/false);
  delegated_.fail(
      topology_.describeRank(getRank()) + " aborted its process group");
  if (auto cuda = cudaBackendIfCreated()) {
    cuda->abort();
  }
  cpuBackend_->abort();
  awaitDumps();
}

void Backend::shutdown() {
  // torch shuts a group down once per device type it registered for.
  if (!summarized_.exchange(true)) {
    innerGroups_->shuttingDown(
        c10::intrusive_ptr<c10d::Backend>::reclaim_copy(this));
  }
  leaving_ = true;
  torchHooks_.quiet();
  awaitDumps();
  stopEngines("shut down its process group", /*drain=*/true);
  delegated_.fail(
      topology_.describeRank(getRank()) + " shut down its process group");
  if (auto cuda = cudaBackendIfCreated()) {
    cuda->shutdown();
  }
  cpuBackend_->shutdown();
}

} // namespace fairring
