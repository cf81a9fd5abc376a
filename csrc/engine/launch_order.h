#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>

#include <c10/util/Exception.h>

namespace fairring {

// The one order in which an engine launches its local steps on a device that
// may run work in launch order (docs/design.md, "Launch order"). It depends
// on op and slice numbers only, so it is the same on every rank of a
// machine, and every local step is its group's next operation on all of
// them at once:
//
//   ops in issue order; within an op of S slices and window W, the
//   reduce-scatters of slices 0 .. W-1, then for j = 0, 1, ...: the
//   all-gather of slice j, then the reduce-scatter of slice j + W (while
//   there is one).
//
// An op's first reduce-scatter follows the previous op's last all-gather:
// when an all-gather is due, which ops come next is not yet known on every
// rank, and the caller may be waiting for it before it issues them. W comes
// from stagingWindow, so a slice whose turn it is never waits for staging
// that only a later all-gather gives back.
//
// A launch of another communicator's (a delegated all-reduce, which NCCL
// runs; Engine::launchInTurn) takes its place between ops the same way:
// after every step of the ops issued before it, before any of those issued
// after it. It stays next until whoever launches it says it is done.
//
// Plain state: its owner's lock (the engine's mutex_) guards it.
class LaunchOrder {
 public:
  enum class Step { kReduceScatter, kAllGather };

  // `enforced` false: any step may launch at any time (the CPU, where the
  // local steps block their thread, not a device queue; one rank per
  // machine, where no local step waits for another rank). Then issued()
  // keeps nothing and drained() is always true.
  explicit LaunchOrder(bool enforced) : enforced_(enforced) {}

  bool enforced() const {
    return enforced_;
  }
  // Op `op` (the engine's number) was queued with `slices` slices, of which
  // `window` (1 to `slices`) may be reduce-scattered before the first
  // all-gather.
  void issued(uint64_t op, int64_t slices, int64_t window);
  // A launch of another communicator's was issued after the ops so far.
  void issuedForeign();
  // Whether `step` of slice `index` of op `op` is the next launch.
  bool isNext(Step step, uint64_t op, int64_t index) const;
  // Whether the next launch is another communicator's.
  bool foreignNext() const {
    return !ops_.empty() && ops_.front().foreign;
  }
  // The next launch was made: a step of the front op's, or the foreign one.
  void launched(Step step);
  void launchedForeign();
  // Every step of every op issued so far was launched.
  bool drained() const {
    return ops_.empty();
  }

 private:
  struct Pending {
    uint64_t op;
    int64_t slices;
    int64_t window;
    bool foreign = false; // another communicator's launch, not an op
  };
  // How many reduce-scatters of the front op may be launched now.
  int64_t reduceScattersAllowed() const;

  const bool enforced_;
  std::deque<Pending> ops_; // issued, not yet all launched
  int64_t reduceScattersLaunched_ = 0; // of the front op
  int64_t allGathersLaunched_ = 0; // of the front op
};

inline void LaunchOrder::issued(uint64_t op, int64_t slices, int64_t window) {
  TORCH_INTERNAL_ASSERT(
      slices > 0 && window > 0 && window <= slices,
      "fairring: launch order: op ",
      op,
      " issued with ",
      slices,
      " slices and a window of ",
      window,
      "; a fairring bug: please report it");
  if (enforced_) {
    ops_.push_back(Pending{op, slices, window});
  }
}

inline int64_t LaunchOrder::reduceScattersAllowed() const {
  const Pending& front = ops_.front();
  return std::min(front.slices, allGathersLaunched_ + front.window);
}

inline void LaunchOrder::issuedForeign() {
  if (enforced_) {
    ops_.push_back(Pending{0, 0, 0, /*foreign=*/true});
  }
}

inline bool LaunchOrder::isNext(Step step, uint64_t op, int64_t index) const {
  if (!enforced_) {
    return true;
  }
  if (ops_.empty() || ops_.front().foreign || ops_.front().op != op) {
    return false;
  }
  const int64_t allowed = reduceScattersAllowed();
  if (step == Step::kReduceScatter) {
    return index == reduceScattersLaunched_ && index < allowed;
  }
  return index == allGathersLaunched_ && reduceScattersLaunched_ == allowed;
}

inline void LaunchOrder::launchedForeign() {
  if (enforced_) {
    TORCH_INTERNAL_ASSERT(
        foreignNext(),
        "fairring: launch order: a foreign launch ran out of its turn; a "
        "fairring bug: please report it");
    ops_.pop_front();
  }
}

inline void LaunchOrder::launched(Step step) {
  if (!enforced_) {
    return;
  }
  TORCH_INTERNAL_ASSERT(
      !ops_.empty() && !ops_.front().foreign,
      "fairring: launch order: a slice launched with no engine op next; a "
      "fairring bug: please report it");
  if (step == Step::kReduceScatter) {
    ++reduceScattersLaunched_;
    return;
  }
  if (++allGathersLaunched_ == ops_.front().slices) {
    ops_.pop_front();
    reduceScattersLaunched_ = 0;
    allGathersLaunched_ = 0;
  }
}

} // namespace fairring
