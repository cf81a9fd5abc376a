#pragma once

// The state of an op and of each of its slices: the work path
// (engine/slices.cpp) moves them along, the failure handling
// (engine/failures.cpp) reads where they are stuck. Internal to the engine.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "errors.h"
#include "reduction.h"

namespace fairring {

// Where a slice is, for a timeout's error.
enum class SliceStep : int {
  kQueued,
  kStaging,
  kLocalReduceScatter,
  kAwaitShards,
  kReducing,
  kAwaitReduced,
  kLocalAllGather,
  kDone,
};

// When an op's device work has all been launched, on a device that launches
// ahead: what a wait on its Work waits for on the host before it makes the
// caller's stream wait for `done`, the output queue after its last local
// step. Shared with the Work's hold, which may outlive the engine.
class LaunchEnd {
 public:
  void launched(Fence done) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = std::move(done);
    }
    changed_.notify_all();
  }
  // The engine stopped, whether or not the op was launched: a wait from
  // now on waits on the host for the op's future, which fails, rather than
  // hold a stream on work that runs on what the memory held.
  void stopped() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopped_ = true;
    }
    changed_.notify_all();
  }
  // Blocks until either; the fence to wait for, or nothing once stopped.
  std::optional<Fence> await() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_.has_value() || stopped_; });
    return stopped_ ? std::nullopt : done_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopped_ = false;
  std::optional<Fence> done_;
};

struct Engine::Op {
  Collective kind = Collective::kAllReduce;
  uint64_t seq; // the engine's: rails tags carry it
  uint64_t collective; // the group's number, as errors name the op
  // The caller's result: the all-reduce's tensor, or the output of a
  // reduce-scatter or an all-gather (contiguous).
  at::Tensor tensor;
  // The input, 1-D and contiguous; aliases `tensor` for an all-reduce unless
  // copyBack.
  at::Tensor elements;
  // `elements` is a copy: the result goes back into `tensor` when the op
  // completes (launching ahead: after its last all-gather, which clears it).
  bool copyBack = false;
  // A reduce-scatter's or all-gather's elements per rank (its chunk), which
  // its slices cut into columns; 0 for an all-reduce.
  int64_t chunkNumel = 0;
  c10d::ReduceOp::RedOpType reduceOp;
  std::chrono::milliseconds timeout;
  Clock::time_point deadline;
  Fence inputReady; // the caller's work on the input
  ProfilerContext profiler; // the caller's, for the stage threads
  std::vector<std::weak_ptr<SliceWork>> slices; // set before they are queued
  std::atomic<int64_t> slicesLeft{0};
  std::atomic<bool> settled{false};
  // Completed on the stage threads; the caller gets its relay.
  c10::intrusive_ptr<c10::ivalue::Future> future;
  // Where the engine launches ahead; null otherwise.
  std::shared_ptr<LaunchEnd> launchEnd;

  std::string describe() const {
    return std::string(collectiveName(kind)) + " #" +
        std::to_string(collective) + " (" +
        std::to_string(std::max(elements.numel(), tensor.numel())) + " x " +
        c10::toString(elements.scalar_type()) +
        (kind == Collective::kAllGather
             ? std::string()
             : ", " + std::string(reduceOpName(reduceOp))) +
        ")";
  }

  // On the all-gather stage's queue, after the slice's last device work:
  // with CUDA, completion records the future's events on its stream.
  void finishSlice() {
    if (--slicesLeft != 0 || settled.exchange(true)) {
      return;
    }
    try {
      if (copyBack) {
        tensor.copy_(elements.view(tensor.sizes()));
      }
    } catch (const std::exception& error) {
      // Settled already: fail() would do nothing, and the op never complete.
      future->setError(distError(
          ErrorClass::kBackend,
          "fairring: " + describe() +
              ": copying the result back into the caller's tensor failed: " +
              error.what()));
      return;
    }
    future->markCompleted(c10::IValue(std::vector<at::Tensor>{tensor}));
  }

  void fail(const std::string& message, ErrorClass errorClass) {
    if (!settled.exchange(true)) {
      future->setError(distError(errorClass, message));
    }
  }
};

// Whether a slice of `plan`, `rows` rows of it, is staged in a copy of its
// own: padded, or its rows reordered (a reduce-scatter's, an all-gather's).
inline bool stagedInCopy(const Slice& plan, int64_t rows) {
  return plan.padded() || rows > 1;
}

struct Engine::SliceWork {
  std::shared_ptr<Op> op;
  int64_t index;
  // An all-reduce's slice of its elements; a reduce-scatter's or an
  // all-gather's, of the columns of its chunks (every rank's chunk is cut
  // alike, so the slice is `rows` of them).
  Slice plan;
  int64_t rows = 1; // 1 for an all-reduce; else the group's size
  at::Tensor input; // an all-reduce's slice of op->elements; else undefined
  std::optional<StagingRing::Lease> lease;
  at::Tensor padded; // staging copy of a padded slice; else undefined
  at::Tensor parts; // [L, slot]: every local rank's part of my slot
  at::Tensor slot; // parts[0]
  at::Tensor shards; // [machines, shard]: every machine's part of my shard
  Fence reduceScattered; // steps 1 done, shards[me] copied
  Fence reduced; // step 3 done
  std::atomic<SliceStep> step{SliceStep::kQueued};
  // Guarded by the engine's mutex_. By machine: what has arrived, and the
  // sends still in flight.
  std::vector<char> shardFrom;
  std::vector<char> reducedFrom;
  std::vector<int> sendsTo;
  int shardsReceived = 0;
  int reducedReceived = 0;
  int writesPending = 0;
  // Sends the rails still keep for a resend (rails/lanes.h); the lease goes
  // back once none does and the all-gather is launched.
  int sendsKept = 0;
  bool gathered = false;
  Fence shardsArrived; // the latest arrival covers every earlier one
  Fence reducedArrived;

  // Where the engine launches ahead (Engine::launchesAhead_). The slice's
  // ticket, for the signals; the last ticket whose staging this lease
  // reuses (0: none); the slot and shards in the rails' copy of staging;
  // its sends not yet written, and not yet released, by the rails (guarded
  // by mutex_); and what it waits for before it completes: its all-gather
  // launched, every arrival, every send written (a rank that completes an
  // op may leave, and its peers need what it sends).
  uint64_t ticket = 0;
  uint64_t previousTicket = 0;
  at::Tensor railsSlot;
  at::Tensor railsShards;
  int sendsUnwritten = 0;
  int sendsLeft = 0;
  std::atomic<int> finishGates{3};

  // Step 1's input and step 5's output.
  at::Tensor io() const {
    return padded.defined() ? padded : input;
  }
  // Elements of the op in this slice, and as staged (padded).
  int64_t numel() const {
    return plan.numel * rows;
  }
  int64_t stagedNumel() const {
    return plan.paddedNumel * rows;
  }
  bool staged() const {
    return stagedInCopy(plan, rows);
  }
  std::string describe() const {
    return std::string(collectiveName(op->kind)) + " #" +
        std::to_string(op->collective) + " slice " + std::to_string(index);
  }
  LocalStepKey localStepKey() const {
    return LocalStepKey{
        op->seq,
        op->collective,
        static_cast<uint64_t>(index),
        op->elements.scalar_type(),
        op->reduceOp};
  }
  // Names everything both ends must agree on, so that ranks that issued
  // different collectives fail instead of reducing mismatched data.
  std::string tag(rails::Lane lane) const {
    return std::to_string(static_cast<int>(lane)) + ":" +
        std::to_string(static_cast<int>(op->kind)) + ":" +
        std::to_string(op->seq) + ":" + std::to_string(index) + ":" +
        c10::toString(op->elements.scalar_type()) + ":" +
        std::to_string(static_cast<int>(op->reduceOp));
  }
};

} // namespace fairring
