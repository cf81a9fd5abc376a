#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "config.h"
#include "device/device.h"
#include "engine/collective.h"
#include "engine/completions.h"
#include "engine/follow_device.h"
#include "engine/footprint.h"
#include "engine/launch_order.h"
#include "engine/plan.h"
#include "engine/stage.h"
#include "engine/staging.h"
#include "engine/ticket_prefix.h"
#include "engine/trace.h"
#include "local/local_steps.h"
#include "rails/failover.h"
#include "rails/lanes.h"
#include "rails/watch.h"
#include "topology.h"

namespace fairring {

enum class SliceStep : int; // engine/ops.h

struct EngineStats {
  int64_t ops;
  int64_t slices;
  int64_t railBytesSent;
  int64_t railBytesReceived;
  std::string localSteps; // LocalSteps::name()
  // By Collective: ops issued, and the bytes of their N-chunk tensors (an
  // all-reduce's tensor, a reduce-scatter's input, an all-gather's output).
  std::array<int64_t, kCollectiveKinds> opsByKind;
  std::array<int64_t, kCollectiveKinds> bytesByKind;
};

// The Herring all-reduce for one process group and one device (the CPU, or
// one CUDA device). Device differences live behind the DeviceContext seam,
// the local steps behind LocalSteps, the rails behind Lanes; this class only
// knows the order of the steps (slices.cpp) and why it stops
// (failures.cpp: causes, settling, the watchdog, who each op waits for).
//
// An all-reduce is cut into slices (engine/plan.h). One slice's life, on the
// rank with local index i of machine m (slices.cpp reads in this order):
//
//   start             staging lease; receives for both lanes expected
//   1. reduce-scatter local all-to-all of slots, then the L parts combined
//   2. rails out      shard k of the slot to the rail peer on machine k
//   3. reduce         this rank's shard from every machine, in one pass
//   4. rails back     the reduced shard to every rail peer
//   5. all-gather     local all-gather of the slots into the caller's tensor
//
// Three stage threads, each taking slices strictly in issue order: the
// reduce-scatter thread (start, 1, 2), the reduce thread (3, 4) and the
// all-gather thread (5; releases the staging, completes the op). Each local
// step has its own group, fed by one thread. On CUDA each stage also has its
// own stream, and a stage waits for an earlier stage's work through that
// slice's fences only; and since a GPU may run all streams in launch order,
// the two local steps take turns in one order that depends on slice numbers
// only, the same on every rank of a machine (engine/launch_order.h;
// docs/design.md, "CUDA").
//
// Failures (docs/design.md, "Failures"). Every op has a deadline, its
// timeout after it was issued; a watchdog thread fails the engine when one
// passes, naming the op, the stage and the peers it was waiting for. A
// failure anywhere stops the engine at once (rails closed, local steps
// abandoned, staging waits interrupted) and fails every pending op and every
// later one with one cause, which names the rank that failed first. Where
// this rank saw the failure first hand (a neighbour's connection broke, a
// neighbour went silent, the ranks disagree, the user aborted) the cause is
// certain: it is announced to the neighbours (rails::Watch), who adopt it.
// Where it saw only an effect (a rail transfer or a local step failed, an op
// timed out with every neighbour still alive) it waits up to kSettleGrace for
// a neighbour's notice before settling for what it saw. The engine does not
// recover.
//
// Futures complete on Completions' workers: callbacks never run on a stage
// thread or the transport's.
class Engine {
 public:
  // How long a cause seen only second hand waits for a better one.
  static constexpr std::chrono::milliseconds kSettleGrace{2000};
  // How long a normal shutdown waits for the device to finish what the
  // engine launched before it closes the local steps (else: aborts them).
  static constexpr std::chrono::seconds kDrainLimit{30};

  // How a failure reached this rank: an op's timeout passed here; this rank
  // saw a connection break or a transfer fail; it failed here (a stage threw,
  // the ranks' collectives differ); or a peer named it (its notice, or its
  // goodbye while this rank still needed it). Ops fail with DistNetworkError
  // for kConnection, else DistBackendError (errors.h).
  enum class FailureKind { kTimeout, kConnection, kLocal, kRemote };

  // What the engine asks of its owner and tells it. Each may be empty; none
  // may block.
  struct Owner {
    // This rank's status, sent with every heartbeat (watchdog thread).
    std::function<std::string()> status;
    // A neighbour's status, from its heartbeat (transport thread).
    std::function<void(int neighbour, std::string_view status)> onPeerStatus;
    // The engine failed for good, for this reason; called once, by the
    // thread that settled it (any thread), before its ops fail. Not called
    // for a departure.
    std::function<void(const std::string& cause, FailureKind kind)> onFailed;
  };

  // `timeline`: where each slice's stages are written; may be null.
  // `timeout`: the group's, which sets the heartbeat interval.
  Engine(
      const Topology& topology,
      const Config& config,
      std::unique_ptr<DeviceContext> device,
      std::shared_ptr<LocalSteps> localSteps,
      std::unique_ptr<rails::Mesh> mesh,
      std::chrono::milliseconds timeout,
      std::unique_ptr<Timeline> timeline = nullptr,
      Owner owner = {});
  ~Engine();

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  c10::Device device() const {
    return device_->device();
  }

  // What starting an op hands back: its future, and how a wait on it makes
  // the caller's current stream wait on the device for the op (null where
  // the host waits on the future: the CPU, or an op done at issue).
  struct Started {
    c10::intrusive_ptr<c10::ivalue::Future> future;
    CallerHold holdCaller;
  };

  // Starts an all-reduce of `tensor` (on device()), in place. Must be called
  // in the same order on every rank (c10d's rule). The future holds [tensor]
  // when done, or fails once `timeout` has passed; with CUDA, its events
  // follow the engine's last stage. `collective`: its number in the group,
  // by which errors name it. `tensor` must not require grad: the engine's
  // threads run in grad mode (the Backend passes a detached alias).
  Started allreduce(
      const at::Tensor& tensor,
      c10d::ReduceOp::RedOpType op,
      std::chrono::milliseconds timeout,
      uint64_t collective);

  // Starts a reduce-scatter: `output` (C elements) = `op` over every rank's
  // chunk number rank() of its `input` (N x C elements, chunks in group-rank
  // order). Both contiguous, on device(), without grad. `output` may be
  // this rank's chunk of `input` (in place, as FSDP has it): a slice reads
  // and writes only its own columns, reading before it writes.
  // As allreduce() otherwise; the future holds [output].
  Started reduceScatter(
      const at::Tensor& input,
      const at::Tensor& output,
      c10d::ReduceOp::RedOpType op,
      std::chrono::milliseconds timeout,
      uint64_t collective);
  // Starts an all-gather: `output` (N x C elements) = every rank's `input`
  // (C), in group-rank order. As reduceScatter() otherwise.
  Started allGather(
      const at::Tensor& input,
      const at::Tensor& output,
      std::chrono::milliseconds timeout,
      uint64_t collective);

  // Whether it was given the group's whole layout, which reduceScatter()
  // and allGather() need; and giving it (Topology::layout()), on the thread
  // that issues ops, before the first of them.
  bool knowsLayout() const;
  void adoptLayout(const std::vector<std::vector<int>>& machines);

  // Fails all pending and later ops because this rank `did` something
  // ("shut down its process group"), tells the neighbours (a goodbye where
  // nothing is pending), and lets the stage threads return. The local
  // groups: leave() lets the device finish what was launched and shuts them
  // down in good order, as a normal end of a job does, so it returns once
  // the device has (at most kDrainLimit: then it aborts them); abort()
  // aborts both at once, whatever runs (Backend::abort, SHRINK_ABORT), and
  // returns at once. Any thread.
  void leave(const std::string& did);
  void abort(const std::string& did);
  // How the engine stopped its local steps so far: "running", "closed" (a
  // departure, after the device drained) or "aborted".
  std::string localStepsState() const;

  // Whether it launches its local steps in one order on every rank of a
  // machine (engine/launch_order.h): a device with streams, 2+ ranks per
  // machine.
  bool ordersLaunches() const {
    return launchOrder_.enforced();
  }

  // Blocks until the local steps of every op issued so far (and every
  // launchInTurn before) are launched on the device, or the engine has
  // failed: a NCCL collective the caller launches next then follows them on
  // every rank, as the launch order needs (docs/design.md, "Launch order").
  // At once where launches need no order (the CPU).
  void awaitLaunchesOfIssuedOps();

  // Launches `launch`, a collective of another communicator's (the group's
  // delegate) that the caller issues now, in its place in the launch order:
  // after the local steps of every op issued so far, before those of the
  // ops issued after it. Where that is now (nothing pending, or launches
  // need no order), on the caller's thread before this returns; else on the
  // stage thread that makes the launch before it, and this returns at once,
  // so the caller does not wait a network round trip for the engine's last
  // all-gathers. If the engine stops first, `failed` runs with its error
  // instead (on the thread that stops it, or the caller's). Neither may
  // throw or block.
  void launchInTurn(
      std::function<void()> launch,
      std::function<void(const std::string&)> failed);
  // `outer` completes as `inner` did, on this engine's completion workers,
  // never on the calling thread (a stage thread, for launchInTurn's).
  void completeOnWorkers(
      const c10::intrusive_ptr<c10::ivalue::Future>& inner,
      c10::intrusive_ptr<c10::ivalue::Future> outer) {
    completions_->relayInto(inner, std::move(outer));
  }
  // The same for a Work without a future, waited for on a worker.
  void completeOnWorkersAfterWait(
      c10::intrusive_ptr<c10d::Work> work,
      c10::intrusive_ptr<c10::ivalue::Future> outer) {
    completions_->relayWaitInto(std::move(work), std::move(outer));
  }

  // The group's timeout changed (set_timeout): ops take theirs when issued;
  // the local steps' groups, which time steps by it, get the new one, and
  // the heartbeats and the rails' failover follow it.
  void setTimeout(std::chrono::milliseconds timeout);

  // Fails the engine with a cause this rank saw first hand and no rank is
  // more to blame for (`what` names the ranks), and announces it. Any
  // thread; returns at once.
  void fail(const std::string& what);

  StagingStats stagingStats() const {
    return staging_.stats();
  }
  std::string describeRails() const {
    return mesh_->describe() +
        (failover_ ? "; " + failover_->describe() : std::string());
  }
  EngineStats stats() const;
  // What it holds by its own count, with what making it added to the
  // process: `before` was counted just before it was made.
  EngineFootprint footprint(const ProcessCounts& before) const;

  // One line per op issued and not yet settled: its number, size, dtype and
  // op, its age, and where it waits and for which ranks, as its timeout would
  // name them (fairring.pending()). Any thread.
  std::vector<std::string> pending() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Op;
  struct SliceWork;
  using Queue = std::deque<std::shared_ptr<SliceWork>>;

  // Why the engine stopped, as every rank will report it.
  struct Cause {
    static constexpr int kNoCulprit = -1;
    int culprit = kNoCulprit; // the rank that failed first, if known
    std::string what; // a sentence that names it
    bool certain = false; // else: wait for a neighbour's notice first
    // This rank leaves in good order: with no op pending, it only says
    // goodbye, which stops no other rank.
    bool departure = false;
    // A departure's local groups are shut down once the device has finished
    // (else aborted): false where this rank aborts.
    bool drain = false;
    Clock::time_point settleBy{}; // for an uncertain one
    FailureKind kind = FailureKind::kConnection;

    // Seen first hand: it settles at once.
    static Cause firstHand(std::string what, int culprit = kNoCulprit) {
      return Cause{culprit, std::move(what), true};
    }
    // Seen second hand (a peer's connection broke, a stage threw): it waits
    // kSettleGrace for a neighbour's notice that names a better one.
    static Cause secondHand(std::string what, int culprit = kNoCulprit) {
      return Cause{culprit, std::move(what), false};
    }
    // This rank, `rank`, leaves; `drain`: in good order (leave()).
    static Cause leaving(int rank, std::string what, bool drain) {
      return Cause{rank, std::move(what), true, /*departure=*/true, drain};
    }
  };

  // An op of `kind` on `input` into `tensor`, before its plan; and its
  // slices queued, or the op settled at once (nothing to move, or the
  // engine stopped). Returns what the caller's Work follows.
  std::shared_ptr<Op> makeOp(
      Collective kind,
      const at::Tensor& input,
      const at::Tensor& tensor,
      c10d::ReduceOp::RedOpType reduceOp,
      std::chrono::milliseconds timeout,
      uint64_t collective);
  Started issue(const std::shared_ptr<Op>& op, const std::vector<Slice>& plan);
  // A reduce-scatter's or an all-gather's plan: slices of its chunks'
  // columns.
  std::vector<Slice> chunkPlan(int64_t chunkNumel, int64_t elementSize) const;
  // The rows of a staged reduce-scatter or all-gather slice ([L x M, slice
  // columns]) and the chunks of the caller's tensor ([N, C]) they hold: row
  // l x M + m is the chunk of the rank with local index l on machine m.
  at::Tensor stagedRows(const SliceWork& slice) const;
  at::Tensor chunkColumns(const SliceWork& slice, const at::Tensor& flat) const;
  // Staged row i <-> row rowRanks_[i] of `columns` (chunkColumns), in the
  // direction `toStaging` says.
  void moveRows(
      const SliceWork& slice, const at::Tensor& columns, bool toStaging) const;
  // An all-gather's step 5 where the local steps place parts as they come
  // (CPU shared memory): every shard row straight to where its rank's chunk
  // goes in the output, with no gathered copy; false where they cannot.
  bool gatherIntoRows(const SliceWork& slice) const;

  // The stage threads' loops, and one slice's steps in order.
  void reduceScatterLoop();
  void reduceLoop();
  void allGatherLoop();
  bool start(const std::shared_ptr<SliceWork>& slice);
  bool reduceScatter(const std::shared_ptr<SliceWork>& slice);
  bool reduce(const std::shared_ptr<SliceWork>& slice);
  bool allGather(const std::shared_ptr<SliceWork>& slice);

  void attachStaging(
      SliceWork& slice, StagingRing::Lease lease, const StagingLayout& layout);
  void expectMessages(const std::shared_ptr<SliceWork>& slice);
  void send(
      const std::shared_ptr<SliceWork>& slice,
      rails::Lane lane,
      int machine,
      const at::Tensor& shard);
  at::Tensor shardOf(const SliceWork& slice, int machine) const;
  // -- Launching ahead (docs/design.md, "The host never waits").
  // The same shard in the rails' copy of staging.
  at::Tensor railsShardOf(const SliceWork& slice, int machine) const;
  // What the rails read or write for `shard`: the rails' copy where the
  // engine launches ahead, else the device's view of staging.
  rails::Buffer railsBuffer(const at::Tensor& shard, bool send) const;
  // `ticket` is done for `signal`: the device hears of it once every
  // earlier ticket is. Needs mutex_.
  void signalLocked(Signal signal, uint64_t ticket);
  // Where a slice stands on the rails, for errors: what it waits for.
  // Needs mutex_.
  SliceStep railsStepLocked(const SliceWork& slice) const;
  // One of the things a slice waits for before it completes happened
  // (SliceWork::finishGates); after the last, its completion is queued
  // behind its all-gather.
  // `onOutputStage`: on the all-gather stage's thread, which queues it
  // itself; else the follower does.
  void passFinishGate(
      const std::shared_ptr<SliceWork>& slice, bool onOutputStage);
  // Queues the slice's completion on the output queue (Op::finishSlice).
  void enqueueFinish(const std::shared_ptr<SliceWork>& slice);
  // What `lane` carries for `slice`, as errors name it ("shards of ...").
  static std::string laneContent(const SliceWork& slice, rails::Lane lane);

  // Waits until the front of `queue` satisfies `ready`, then pops it; null
  // once the engine has failed.
  std::shared_ptr<SliceWork> popWhenReady(
      Queue& queue, const std::function<bool(const SliceWork&)>& ready);
  void push(Queue& queue, std::shared_ptr<SliceWork> slice);
  // Where the staging of a slice of `plan`, `rows` rows of it, lies in its
  // lease: what start() leases and launchWindow() replays.
  StagingLayout leaseLayout(
      const Slice& plan, int64_t rows, int64_t elementSize) const;
  // The window of an op of these slices (LaunchOrder::issued).
  int64_t launchWindow(
      const std::vector<Slice>& plan, int64_t rows, int64_t elementSize) const;
  // The launch of `step` that was next has been made; then any launchInTurn
  // whose turn that brings is made, on this thread.
  void launched(LaunchOrder::Step step);
  // Makes the launchInTurn launches whose turn has come, one at a time.
  void launchDueForeign();

  // `work`, a stage's device work on `slice`, for DeviceContext::enqueue:
  // an error in it stops the engine with a cause that names the step.
  std::function<void()> deviceWork(
      const std::shared_ptr<SliceWork>& slice,
      Stage stage,
      std::function<void()> work);

  // Runs `step` (a stage's work on `slice`) as a span for the profiler and
  // the timeline, which ends before the slice moves on, so every span of an
  // op has ended when the op completes.
  template <typename Step>
  bool traced(Stage stage, const SliceWork& slice, Step&& step);

  // -- Failure handling (engine/failures.cpp).

  // The watchdog: heartbeats, op deadlines, settling uncertain causes.
  void watchdogLoop();
  // Why the oldest expired op is stuck, or nothing if none has expired (then
  // `nextDeadline` is the nearest). Needs mutex_.
  std::optional<Cause> expiredLocked(
      Clock::time_point now, Clock::time_point& nextDeadline);
  std::string waitingForLocked(
      const SliceWork& slice, std::vector<int>& awaited) const;
  // Where `op` is stuck, filling `awaited`; the timeout and pending() say
  // it alike. Needs mutex_.
  std::string whereStuckLocked(const Op& op, std::vector<int>& awaited) const;
  // Stops the engine (once) and fails the ops once the cause is settled.
  void stop(Cause cause);
  // On a departure: whether the device finished the work launched so far
  // (every op is settled, but on a device its last all-gathers may still
  // run) within kDrainLimit.
  bool drainDevice();
  // Handlers of the rails and the watch (transport thread).
  void onRailsFailure(int peerRank, bool mismatch, const std::string& message);
  void onNotice(int neighbour, const rails::Watch::Notice& notice);
  void onLost(int neighbour, const std::string& error);
  // An "acked" note for the lanes, or a switch note for the failover.
  bool onRailsNote(int neighbour, const std::string& text);
  void onBye(int neighbour);
  bool departed(int rank) const; // said goodbye; needs mutex_
  // "rank 3 (machine 1 of 2)".
  std::string who(int rank) const;
  // The cause when `rank`, which said goodbye, is needed after all.
  Cause stillNeeded(int rank, const std::string& detail) const;

  bool failed() const {
    return failed_.load();
  }

  const Topology topology_;
  const Config config_;
  // The ranks by local index, then machine (l x M + m), on device(): which
  // chunk each staged row of a reduce-scatter or all-gather holds. Undefined
  // until adoptLayout(); set under mutex_ before the first slice that reads
  // it is queued.
  at::Tensor rowRanks_;
  // The same, on the host: on CPU rows are moved one memcpy each, where
  // index_select and index_copy_ go element by element.
  std::vector<int64_t> rowRankList_;
  // Before the device: the work queued there calls the local steps, and the
  // device's queues go first.
  const std::shared_ptr<LocalSteps> localSteps_;
  const std::unique_ptr<DeviceContext> device_;
  const std::unique_ptr<Timeline> timeline_;
  const Owner owner_;
  // A tenth of the group's timeout, within [100 ms, 5 s]; set_timeout moves
  // it (setTimeout), and the failover's timings with it.
  static std::chrono::milliseconds heartbeatIntervalFor(
      std::chrono::milliseconds timeout);
  static rails::RailFailover::Settings failoverSettings(
      std::chrono::milliseconds timeout);
  std::atomic<std::chrono::milliseconds> heartbeatInterval_;
  const PlanSettings planSettings_;
  // The other machines, starting with the next one, in the order a slice's
  // shards go out: no machine is every sender's first destination.
  const std::vector<int> sendOrder_;
  StagingRing staging_;
  // Whether the device launches ahead (DeviceContext::launchesAhead): the
  // rails then use railsStaging_, a copy of staging in host memory at the
  // same offsets, and follower_ does what waits for the device on the host.
  const bool launchesAhead_;
  at::Tensor railsStaging_;
  const std::shared_ptr<Completions> completions_;
  // The destructor shuts the mesh down before anything else goes: the
  // callbacks of the rails and the watch use the members below.
  std::unique_ptr<rails::Mesh> mesh_;
  std::unique_ptr<rails::Lanes> lanes_;
  std::unique_ptr<rails::Watch> watch_;
  // Where the mesh can switch interfaces; null otherwise. Its threads are
  // joined before the mesh shuts down.
  std::unique_ptr<rails::RailFailover> failover_;

  std::atomic<bool> failed_{false}; // stopped, whether settled or not
  // localStepsState(): 0 running, 1 closed, 2 aborted.
  std::atomic<int> localStepsStopped_{0};
  std::atomic<uint64_t> nextSeq_{0};
  std::atomic<int64_t> slicesDone_{0};
  std::array<std::atomic<int64_t>, kCollectiveKinds>
      opsByKind_{}; // EngineStats
  std::array<std::atomic<int64_t>, kCollectiveKinds> bytesByKind_{};

  mutable std::mutex mutex_;
  std::condition_variable progress_; // any change to the state below
  Queue toReduceScatter_;
  Queue toReduce_;
  Queue toAllGather_;
  LaunchOrder launchOrder_;
  // launchInTurn's launches not yet made, in launch order, and whether one
  // is being made (it stays next in launchOrder_ until it is made).
  struct ForeignLaunch {
    std::function<void()> launch;
    std::function<void(const std::string&)> failed;
  };
  std::deque<ForeignLaunch> foreign_;
  bool foreignRunning_ = false;
  // The all-gather stage's fence for the last slice that gave its staging
  // back: a new lease waits for it before the memory is reused.
  Fence lastReleased_;
  // Launching ahead: the last ticket given, that slice's ticket, and what
  // the device has been told of each signal.
  uint64_t lastTicket_ = 0;
  uint64_t lastReleasedTicket_ = 0;
  std::array<TicketPrefix, kSignals> signalled_;
  std::deque<std::shared_ptr<Op>> liveOps_; // issued, not yet settled
  std::optional<Cause> unsettled_; // stopped, waiting for a better cause
  std::vector<int> departed_; // neighbours that said goodbye
  std::string error_; // the settled cause; empty while none is
  bool stopping_ = false; // the destructor runs: the watchdog returns
  std::condition_variable watchdogWake_;

  // Started last: they use everything above. The follower goes after the
  // stage threads, which post to it, and before the mesh, which it uses.
  std::unique_ptr<DeviceFollower> follower_;
  std::array<std::thread, kStages> threads_;
  std::thread watchdog_;
};

} // namespace fairring
