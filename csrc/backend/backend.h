#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <c10/util/FunctionRef.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend/allreduce_path.h"
#include "backend/c10d_collectives.h"
#include "backend/chunked_path.h"
#include "backend/delegated.h"
#include "backend/hooks.h"
#include "backend/inner_groups.h"
#include "backend/ledger.h"
#include "backend/measured_threshold.h"
#include "backend/memory_order.h"
#include "backend/operation.h"
#include "backend/usage.h"
#include "config.h"
#include "engine/engine.h"
#include "topology.h"

namespace fairring {

// The c10d backend registered as "fairring" for both CPU and CUDA tensors.
//
// It owns a process group's state and routes each collective by the device
// of its tensors to that device type's delegate: Gloo for CPU tensors, NCCL
// for CUDA tensors (made on first use, and only where a GPU exists). Both are
// made by torch's own constructors, through the InnerGroupFactory. All-reduces
// in groups that span several machines with equally many ranks run on the
// Herring engine instead: always for CPU tensors; for CUDA tensors when
// Config::cudaEngine is set. Other groups, and all-reduces below
// Config::flatThresholdBytes for their device type, take the flat path: the
// delegate.
//
// A group costs what its Gloo group costs until it needs more: the engine
// for a device (its local groups, rails, staging and threads) is made by the
// group's first all-reduce that it serves on that device, a point every rank
// reaches at the same place of its sequence of collectives.
//
// Overrides use the collective names torch 2.11 and 2.15 both have (2.15
// forwards its newer names, e.g. all_gather_single, to them).
//
// Any thread may call the collectives (DDP issues them from autograd
// threads); c10d requires that every rank issues them in the same order.
class Backend final : public c10d::Backend {
 public:
  Backend(
      c10::intrusive_ptr<c10d::Store> store,
      Topology topology,
      Config config,
      std::chrono::milliseconds timeout,
      c10::intrusive_ptr<c10d::Backend> cpuBackend,
      std::shared_ptr<InnerGroupFactory> innerGroups);
  ~Backend() override;

  const Topology& topology() const {
    return topology_;
  }
  const Config& config() const {
    return config_;
  }
  std::chrono::milliseconds timeout() const {
    return timeout_.load();
  }
  // The engine for tensors of `type`; null until an all-reduce made it, and
  // always where the group takes the flat path.
  const Engine* engine(c10::DeviceType type) const;
  // All-reduces of tensors of `type` that went to the delegate because they
  // were below the flat threshold.
  int64_t belowThresholdAllreduces(c10::DeviceType type) const {
    return belowThreshold_[indexOfType(type)].load();
  }
  // What the group's all-reduces, reduce-scatters and all-gathers went
  // through, by device type, kind and path (backend/usage.h).
  std::vector<UsageRow> usage() {
    return usage_.rows();
  }
  // The path a `kind` of one dense tensor of `bytes` (the N-chunk side's)
  // of `dtype` on `device`, with SUM, would take now, and why: from the
  // functions the collective decides by (allreduce_path.h, chunked_path.h).
  // Measures nothing: where auto has yet to measure the engine against the
  // delegate, `decided` is false: the path is not known yet.
  struct PathAnswer {
    bool onEngine = false;
    bool decided = true;
    PathReason reason = PathReason::kEngine;
  };
  PathAnswer pathFor(
      Collective kind,
      int64_t bytes,
      at::ScalarType dtype,
      c10::Device device) const;
  // What the engine for tensors of `type` holds, and what making it added to
  // the process (engine/footprint.h); empty until it is made.
  std::optional<EngineFootprint> footprint(c10::DeviceType type) const;
  // What FAIRRING_FLAT_THRESHOLD=auto decided for `kind` on tensors of
  // `type`; empty until measured, and where the threshold is not measured.
  std::optional<MeasuredThreshold> measuredThreshold(
      c10::DeviceType type, Collective kind = Collective::kAllReduce) const;

  const std::string getBackendName() const override {
    return "fairring";
  }

  // Collectives issued so far, engine and delegate alike (not point-to-point
  // operations, which ranks issue in different numbers): equal on every rank
  // of a group in step. Each Work fairring makes carries its number.
  uint64_t getSequenceNumberForGroup() override {
    return ledger_.issued();
  }
  // Numbers start at 0 on every rank: nothing to agree on.
  void setSequenceNumberForGroup() override {}

  // For later operations: the delegates' and engines made from now on.
  void setTimeout(std::chrono::milliseconds timeout) override;

  // Each engine op of this group issued and not yet settled, one line each
  // (backend/pending_report.h).
  std::vector<std::string> pending() const;

  // init_process_group(device_id=...): the NCCL delegate is made and
  // connected on that device now, as "nccl" would be, instead of at the first
  // CUDA collective, and so is the CUDA engine where it will serve this
  // group (prepareEngine). Every rank calls it at init, so the collective
  // communicator creation lines up.
  void eagerConnectSingleDevice(at::Device device) override;
  c10::intrusive_ptr<Options> getBackendOptions() override;

  // A test's negative control: with false, delegated all-reduces wait on
  // the caller's thread for the engine's launches again (followEngineLaunches)
  // instead of taking their turn. Process-wide; never set outside tests.
  static void setLaunchInTurnForTests(bool enabled);
  // A test's negative control: with false, a native coalescing block's
  // first member no longer waits for the launches in turn issued before it,
  // so a stage thread may launch one into the delegate while the block is
  // open. Process-wide; never set outside tests.
  static void setBlockFollowsLaunchesForTests(bool enabled);
  // A test's negative control: with false, a failure of the group leaves
  // the CUDA delegate running, as before (its pending kernels wait for
  // NCCL's watchdog). Process-wide; never set outside tests.
  static void setDelegateAbortedOnFailureForTests(bool enabled);
  // Tests: `delegate` serves this group's CUDA tensors from now, as if the
  // group had made it (a stand-in that records how it is stopped).
  void adoptCudaDelegateForTests(c10::intrusive_ptr<c10d::Backend> delegate);

  // split_group: a fairring backend over some of this group's ranks.
  bool supportsSplitting() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::vector<int>& ranks,
      const c10::intrusive_ptr<Options>& opts) override;

  // shrink_group: a fairring backend over this group's ranks less
  // `ranksToExclude`, made by those ranks alone (docs/design.md,
  // "Shrinking"). With SHRINK_ABORT this group's pending ops fail first;
  // otherwise they fail when c10d destroys this group, right after.
  bool supportsShrinking() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranksToExclude,
      int shrinkFlags,
      const c10::intrusive_ptr<Options>& optsOverride) override;

  // Why the group failed, as c10d's get_error() classes it: TIMEOUT where
  // an op's timeout passed on this rank, COMM_ERROR where this rank saw a
  // peer's connection break or its own network go, REMOTE_ERROR where a
  // peer named the cause; SUCCESS while nothing has failed.
  c10d::ErrorType getError() override;
  // The sentence that names the group's failure, as its ops' errors give
  // it; empty while nothing has failed.
  std::string failure() const {
    return delegated_.failure();
  }

  // The collectives (backend/c10d_collectives.h). Barriers run on the CPU
  // group, which every rank has whatever its device.
#define FAIRRING_DECLARE_COLLECTIVE(name, parameters, arguments) \
  c10::intrusive_ptr<c10d::Work> name parameters override;
  FAIRRING_C10D_COLLECTIVES(FAIRRING_DECLARE_COLLECTIVE)
#undef FAIRRING_DECLARE_COLLECTIVE

  void monitoredBarrier(
      const c10d::BarrierOptions& opts, bool waitAllRanks) override;

  // Coalescing (batch_isend_irecv, _coalescing_manager): the first operation
  // in a block decides the device type. Operations for the delegate coalesce
  // natively where it can (NCCL) and run at once where it cannot (Gloo);
  // engine all-reduces run at once. endCoalescing returns one Work for all.
  bool supportsCoalescing() const override {
    return true;
  }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void abort() override;
  void shutdown() override;

#if FAIRRING_HAS_BACKEND_HOOKS
  // Completion hooks hear of every Work fairring hands out that succeeds
  // (engine, delegated, point-to-point, barrier, coalesced), once, under a
  // key never reused in the process. Abort hooks run where a failure settles:
  // the engine's, or a handed-out Work that failed or timed out, before the
  // error reaches its waiter.
  bool supportsCompletionHooks() const override {
    return true;
  }
  void registerCompletionHook(int64_t id, c10d::CompletionHook hook) override;
  void unregisterCompletionHook(int64_t id) override;
  bool supportsAbortHooks() const override {
    return true;
  }
  void registerAbortHook(int64_t id, c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t id) override;
#endif

 private:
  // Where an operation runs, and its number if it is a collective.
  struct Runner {
    Engine* engine = nullptr; // the Herring engine, or else
    c10d::Backend* delegate = nullptr; // the delegate of its device type
    std::optional<uint64_t> seq;
    // The engine in whose launch order the delegate's launch takes its turn
    // (Operation::launchesInTurn); null: launched by the caller, now.
    Engine* inTurn = nullptr;
  };
  // The funnel every operation goes through (backend.cpp lists its steps in
  // order): the ledger, the runner, refusal after a failure, Gloo's rules,
  // the coalescing block, memory order, launch order, then `launch(runner)`
  // (the operation's own part, which returns its Work), the CPU watch, the
  // report to torch's hooks, and memory-order tracking.
  // (`launch` runs once, before issue returns: a reference does.)
  using Launch =
      c10::function_ref<c10::intrusive_ptr<c10d::Work>(const Runner& runner)>;
  c10::intrusive_ptr<c10d::Work> issue(Operation op, Launch launch);

  // The Work to hand out for `work`: reported to torch's hooks, or, where it
  // was launched during graph capture, kept from every query
  // (CapturedWork).
  c10::intrusive_ptr<c10d::Work> handOut(
      c10::intrusive_ptr<c10d::Work> work, bool captured);

  // How an operation belongs to the open coalescing block: not at all; as a
  // member of the delegate's own (NCCL's group call), which orders and
  // launches it at the block's end; or collected, its Work among the
  // block's (Gloo's, or the engine's, which run at once).
  enum class BlockMembership { kNone, kNative, kCollected };
  // `captured`: the operation was issued during graph capture.
  BlockMembership joinBlock(
      const Operation& op, const Runner& runner, bool captured);
  // The open coalescing block, its device type set by its first operation
  // and checked against `type`; null when none is open. Needs
  // coalescingMutex_.
  struct CoalescingBlock;
  CoalescingBlock* openBlockLocked(const char* opName, c10::DeviceType type);
  bool coalescingBlockOpen();

  c10d::Backend& delegate(c10::DeviceType type);
  bool isCpu(const c10d::Backend& inner) const {
    return &inner == cpuBackend_.get();
  }
  c10d::Backend& cudaBackend();
  c10::intrusive_ptr<c10d::Backend> cudaBackendIfCreated() const;

  // The path of an all-reduce (backend/allreduce_path.h) in this group, and
  // the operation the funnel takes for it (which counts it in
  // belowThresholdAllreduces where the threshold sent it to the delegate).
  AllreduceRoute choosePath(const AllreduceArgs& args);
  // Once per process, where the collective is a captured CUDA one the engine
  // would have taken: it goes to NCCL instead.
  void noteIfCapturedGoesToNccl(bool captured, c10::DeviceType deviceType);
  // The sizes the engine takes for `args`' device type. A threshold still to
  // be measured is measured here, by the first all-reduce the engine could
  // take (a point every rank reaches alike), unless it is issued inside a
  // coalescing block, where the measurement's own collectives cannot run:
  // that one goes to the delegate. (The engine takes no captured one.)
  EngineSizes engineSizesFor(const AllreduceArgs& args);
  // The same for a reduce-scatter or an all-gather, measured apart, by the
  // group's first of that kind the engine could take.
  EngineSizes engineSizesFor(const ChunkedArgs& args, c10::Device device);
  // The engine's sizes for `kind` on tensors of `type` as they stand (the
  // threshold kMeasuredThreshold while auto has not measured), measuring
  // nothing.
  EngineSizes engineSizesInForce(
      c10::DeviceType type, Collective kind = Collective::kAllReduce) const;
  // The measurement of `kind` on `device`, under measuringMutex_, unless
  // another thread measured it first; or the delegate's sizes inside a
  // coalescing block.
  EngineSizes measureEngineSizes(c10::Device device, Collective kind);
  // The measurement's collectives: one SUM (or all-gather) on the path
  // named, through the funnel like any other, waited for.
  void collectiveOnPath(
      Collective kind, at::Tensor& output, at::Tensor& input, bool onEngine);
  void allreduceOnPath(at::Tensor& tensor, bool onEngine);
  void chunkedOnPath(
      Collective kind, at::Tensor& output, at::Tensor& input, bool onEngine);
  // A reduce-scatter or all-gather in any of c10d's forms, on the engine or
  // the delegate (backend/chunked_collectives.cpp).
  struct ChunkedCall {
    Collective kind;
    c10d::OpType opType; // its Work's, and its profiling name
    const char* profilingName;
    Operation op; // as the funnel takes it
    std::vector<ChunkedPart> parts; // its tensors as pairs
    std::vector<at::Tensor> inputs; // what it reads (PREMUL_SUM's rules)
    c10d::ReduceOp reduceOp;
    std::chrono::milliseconds timeout;
  };
  template <typename OnDelegate>
  c10::intrusive_ptr<c10d::Work> chunked(
      ChunkedCall call, OnDelegate&& onDelegate);
  // Its launch, on the path chosen (`onEngine`), through the funnel.
  template <typename OnDelegate>
  c10::intrusive_ptr<c10d::Work> launchChunked(
      const ChunkedArgs& args,
      bool onEngine,
      ChunkedCall call,
      OnDelegate&& onDelegate);
  // The group's whole layout, gathered once (InnerGroupFactory::layout) by
  // the first engine reduce-scatter or all-gather, which every rank issues
  // alike.
  std::vector<std::vector<int>> groupLayout();
  // The launch of an all-reduce on the runner the funnel chose.
  c10::intrusive_ptr<c10d::Work> launchAllreduce(
      const Runner& runner,
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts,
      const AllreduceRoute& route);
  Operation allreduceOperation(
      const char* name,
      const AllreduceArgs& args,
      const AllreduceRoute& route,
      const std::vector<at::Tensor>& tensors);
  // The engine for `device`, made here on first use; null where the device
  // type's engine is on another device (the delegate then runs the op). A
  // CUDA engine runs one all-reduce of a slice before it is handed out
  // (warmUp), so that what the rails allocate at their first transfer is
  // allocated now.
  Engine* ensureEngine(c10::Device device);
  void warmUp(Engine& engine);
  // The CUDA engine, made now where it will serve this group's CUDA
  // all-reduces and is not yet made: at init with device_id, or at the
  // group's first CUDA collective of any kind (not captured, not inside
  // NCCL's own group call), so that iteration 1 allocates nothing new
  // (docs/design.md, "Made before the first step"). Collective: every rank
  // reaches it at the same point of its sequence. CPU engines are made by
  // their first all-reduce, except on the emulated device with eager_engine
  // (device/emulated.h), where the tests run this path.
  void prepareEngine(c10::Device device);

  c10::intrusive_ptr<c10d::Work> alltoallAsSingle(
      c10d::Backend& gloo,
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts,
      uint64_t seq);

  // Before a delegated operation is launched: the local steps of every op
  // issued so far to the engine of its device type are launched first, so
  // that every rank launches them and the NCCL operation in one order
  // (docs/design.md, "Launch order"). At once where that engine keeps no
  // launch order (the CPU's), or before one exists.
  void followEngineLaunches(c10::DeviceType type);
  // `launch` (the delegate's operation) made in its turn on `engine`
  // (Engine::launchInTurn), on the caller's current stream; the Work that
  // stands for it.
  c10::intrusive_ptr<c10d::Work> launchedInTurn(
      Engine& engine,
      std::function<c10::intrusive_ptr<c10d::Work>()> launch,
      c10d::OpType opType,
      const std::vector<at::Tensor>& tensors,
      uint64_t seq);
  // A delegated collective's `launch`, which owns what it needs (a copy of
  // its arguments): made in its turn where the funnel says so
  // (runner.inTurn), else now. `tensors`: its outputs, whose device it is on.
  c10::intrusive_ptr<c10d::Work> launchDelegated(
      const Runner& runner,
      c10d::OpType opType,
      const std::vector<at::Tensor>& tensors,
      std::function<c10::intrusive_ptr<c10d::Work>()> launch);
  // How long aborting or shutting the group down waits for the abort hooks
  // of a failure (the flight recorder's dump) still running.
  static constexpr std::chrono::seconds kDumpWait{30};
  void awaitDumps();
  // Fails every engine's pending ops because this rank `did` something
  // ("shut down its process group"); their local groups are shut down once
  // the device drained (`drain`: shutdown) or aborted at once (abort).
  void stopEngines(const std::string& did, bool drain);
  // An op's own timeout, or the group's where the op sets none.
  std::chrono::milliseconds timeoutOf(std::chrono::milliseconds own) const {
    return own > std::chrono::milliseconds(0) ? own : timeout();
  }
  // Records the collective being issued, with the part of its arguments
  // every rank must give alike (CollectiveLedger), and returns its number
  // (see getSequenceNumberForGroup). Fails the group if a neighbour's report
  // of it differs.
  uint64_t nextCollective(std::string signature);
  // A neighbour's report of its collectives (an engine's transport thread).
  void onPeerStatus(int neighbour, std::string_view status);
  // Fails every engine with `what`, a cause seen first hand here; the
  // engines announce it, and their failure fails the delegated works.
  void failGroup(const std::string& what);
  // The engines made so far (null where none), read under the lock; engines
  // live until the destructor, so the pointers may be used without it.
  std::array<Engine*, 2> madeEngines() const;
  // Whether an engine of either device type is made: the same on every rank,
  // made at one collective of the group's.
  bool anyEngineMade() const;
  // Calls `call(engine)` for each engine made, without holding a lock.
  template <typename Call>
  void forEachEngine(Call&& call);
  // Refuses a delegated collective once the group has failed.
  void checkNotFailed(const char* opName) const;
  // An engine failed for good: kept for getError() (the first failure, and
  // none once this rank is leaving), the abort hooks started, and the
  // delegated works failed with `cause`.
  void onEngineFailed(const std::string& cause, Engine::FailureKind kind);

  // engines_ and belowThreshold_ hold one entry per device type.
  static size_t indexOfType(c10::DeviceType type) {
    return type == c10::kCPU ? 0 : 1;
  }

  const c10::intrusive_ptr<c10d::Store> store_;
  const Topology topology_;
  const Config config_;
  std::atomic<std::chrono::milliseconds> timeout_;
  const c10::intrusive_ptr<c10d::Backend> cpuBackend_;
  const std::shared_ptr<InnerGroupFactory> innerGroups_;
  std::array<std::atomic<int64_t>, 2> belowThreshold_{}; // CPU, CUDA
  // The flat thresholds in force (kMeasuredThreshold until measured), and
  // the ceilings auto measured (stored before their threshold), by
  // sizesIndex().
  static size_t sizesIndex(c10::DeviceType type, Collective kind) {
    return indexOfType(type) * kCollectiveKinds + static_cast<size_t>(kind);
  }
  std::array<std::atomic<int64_t>, 2 * kCollectiveKinds> flatThresholds_;
  std::array<std::atomic<int64_t>, 2 * kCollectiveKinds> engineCeilings_;
  // Held by the one thread measuring a threshold, through its collectives.
  std::mutex measuringMutex_;
  // The first failure's class, for getError(); none recorded once this rank
  // aborts or shuts the group down (the failures are then its own doing).
  std::atomic<c10d::ErrorType> failureKind_{c10d::ErrorType::SUCCESS};
  std::atomic<bool> leaving_{false};
  std::optional<std::vector<std::vector<int>>> layout_; // under stateMutex_
  CollectiveLedger ledger_;
  DelegatedWorks delegated_; // the CPU delegate's collectives
  // The tests' emulated device makes CPU engines as CUDA ones are made.
  const bool emulatedEager_;
  // torch's completion and abort hooks (its flight recorder): every Work
  // handed out goes through torchHooks_.report().
  BackendHooks torchHooks_;
  MemoryOrder memoryOrder_; // collectives in flight, by the memory they touch
  Usage usage_; // what the collectives went through (fairring._summary)
  std::atomic<bool> summarized_{false}; // said at the first shutdown()

  // Serialises the creation of CUDA groups, engines and splits, which calls
  // into Python; never held by a thread that holds the GIL.
  std::mutex creationMutex_;
  mutable std::mutex stateMutex_; // brief: guards the members below
  c10::intrusive_ptr<c10d::Backend> cudaBackend_;
  std::array<std::unique_ptr<Engine>, 2> engines_; // CPU, CUDA
  std::array<std::optional<EngineFootprint>, 2> footprints_; // CPU, CUDA
  std::array<std::optional<MeasuredThreshold>, 2 * kCollectiveKinds>
      measured_; // by sizesIndex()
  // c10d asks once per device type for the same split; one backend serves
  // both. By group name.
  std::unordered_map<std::string, c10::weak_intrusive_ptr<c10d::Backend>>
      splits_;
  int shrinks_ = 0; // made from this group so far: each meets apart

  struct CoalescingBlock {
    std::optional<c10::DeviceType> type; // set by the block's first operation
    bool captured = false; // an operation was issued during graph capture
    c10d::Backend* nativeBlock = nullptr; // delegate coalescing natively
    std::vector<c10::intrusive_ptr<c10d::Work>> works; // the others
  };
  std::mutex coalescingMutex_;
  std::optional<CoalescingBlock> coalescing_; // guarded by coalescingMutex_
};

template <typename Call>
void Backend::forEachEngine(Call&& call) {
  // Failing ops runs their callbacks here, which may call back into this
  // backend: call outside the lock.
  for (Engine* engine : madeEngines()) {
    if (engine != nullptr) {
      call(*engine);
    }
  }
}

} // namespace fairring
