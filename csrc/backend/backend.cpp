#include <torch_headers.h> // first: the precompiled torch headers

// The backend's funnel: what every operation goes through, in order (the
// ledger, the runner, refusal after a failure, Gloo's rules, the coalescing
// block, memory order, launch order, the launch, the report to torch's hooks),
// and what it needs: the group's construction, its delegates and the launch
// order it shares with the engine. The collectives themselves are in
// allreduce.cpp, chunked_collectives.cpp and delegated_collectives.cpp; the
// engines in engines.cpp; the group's life in group_life.cpp.

#include "backend/backend.h"

#include <limits>
#include <memory>
#include <optional>

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include "backend/delegated.h"
#include "backend/pending_report.h"
#include "backend/work.h"
#include "errors.h"
#include "device/capture.h"
#include "device/emulated.h"
#include "device/nccl_delegate_model.h"

namespace fairring {

namespace {

// Backend::setLaunchInTurnForTests.
std::atomic<bool> launchInTurnEnabled{true};
// Backend::setBlockFollowsLaunchesForTests.
std::atomic<bool> blockFollowsLaunches{true};

constexpr const char* kSameCollectives =
    "; every rank must issue the same collectives in the same order, "
    "all-reduces with the same sizes, dtypes and reduce ops";

} // namespace

Backend::Backend(
    c10::intrusive_ptr<c10d::Store> store,
    Topology topology,
    Config config,
    std::chrono::milliseconds timeout,
    c10::intrusive_ptr<c10d::Backend> cpuBackend,
    std::shared_ptr<InnerGroupFactory> innerGroups)
    : c10d::Backend(topology.rank(), topology.worldSize()),
      store_(std::move(store)),
      topology_(std::move(topology)),
      config_(config),
      timeout_(timeout),
      cpuBackend_(asEmulatedDeviceDelegate(std::move(cpuBackend))),
      innerGroups_(std::move(innerGroups)),
      // All three kinds of a device type start from its one setting.
      flatThresholds_{
          config_.cpuFlatThresholdBytes,
          config_.cpuFlatThresholdBytes,
          config_.cpuFlatThresholdBytes,
          config_.cudaFlatThresholdBytes,
          config_.cudaFlatThresholdBytes,
          config_.cudaFlatThresholdBytes},
      engineCeilings_{
          std::numeric_limits<int64_t>::max(),
          std::numeric_limits<int64_t>::max(),
          std::numeric_limits<int64_t>::max(),
          std::numeric_limits<int64_t>::max(),
          std::numeric_limits<int64_t>::max(),
          std::numeric_limits<int64_t>::max()},
      delegated_("fairring: rank " + std::to_string(topology_.rank()) + ": "),
      emulatedEager_([] {
        const auto emulated = emulatedDeviceFromEnv();
        return emulated && emulated->eagerEngine;
      }()) {
  TORCH_CHECK(store_, "fairring: a store is required");
  TORCH_CHECK(cpuBackend_, "fairring: a CPU backend is required");
  TORCH_CHECK(innerGroups_, "fairring: an inner group factory is required");
  TORCH_CHECK(
      cpuBackend_->getRank() == getRank() &&
          cpuBackend_->getSize() == getSize(),
      "fairring: the CPU backend is rank ",
      cpuBackend_->getRank(),
      " of ",
      cpuBackend_->getSize(),
      " but the topology says rank ",
      getRank(),
      " of ",
      getSize());
  init();
  listForPendingReport(this);
}

Backend::~Backend() {
  unlistForPendingReport(this); // waits out a report reading this backend
  // Engines first: their stage threads use the inner groups. Destroyed
  // without the lock: a completion callback they run may call back in here.
  std::array<std::unique_ptr<Engine>, 2> engines;
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    engines.swap(engines_);
  }
  for (auto& engine : engines) {
    engine.reset();
  }
}

c10d::Backend& Backend::delegate(c10::DeviceType type) {
  return type == c10::kCPU ? *cpuBackend_ : cudaBackend();
}

// The funnel: every operation, in this order. Its own part, `launch`, gets
// where it runs and its number, and returns its Work.
c10::intrusive_ptr<c10d::Work> Backend::issue(Operation op, Launch launch) {
  Runner runner;
  // The ledger numbers a collective, and compares it with the neighbours'.
  if (op.signature) {
    runner.seq = nextCollective(std::move(*op.signature));
  }
  // Captured into a CUDA graph (device/capture.h): what it launches is
  // recorded, not run, and nothing of fairring's may query it or wait for
  // work from outside the capture. NCCL orders its own launches.
  const bool captured =
      op.captured ? *op.captured : graphCaptureUnderway(deviceOf(op));
  // Where it runs: the engine the path decision chose, made on first use (a
  // collective step), else the delegate of its device type. A delegated
  // collective is refused once the group has failed, before its delegate is
  // made (the first CUDA one makes NCCL's group); the engine refuses its own
  // ops, as a failed Work, the way its other failures reach them.
  if (op.engineDevice) {
    runner.engine = ensureEngine(*op.engineDevice);
  } else if (runner.seq && !captured) {
    prepareEngine(deviceOf(op)); // before the first step needs it
  }
  if (runner.engine == nullptr) {
    if (runner.seq) {
      checkNotFailed(op.name);
    }
    runner.delegate = &delegate(op.type);
  }
  const bool onGloo = runner.delegate != nullptr && isCpu(*runner.delegate);
  // Gloo's rules, before anything is written.
  if (op.reduceOp && onGloo) {
    checkGlooReduction(op.name, *op.reduceOp, op.reduced);
  }
  const BlockMembership membership =
      op.coalesces ? joinBlock(op, runner, captured) : BlockMembership::kNone;
  // After the collectives in flight on the same memory, once.
  const auto executor = runner.engine != nullptr
      ? MemoryOrder::Executor::kEngine
      : onGloo ? MemoryOrder::Executor::kGloo
               : MemoryOrder::Executor::kNccl;
  const bool ordered = runner.seq && !captured;
  if (ordered) {
    memoryOrder_.awaitOverlapping(op.touches, executor, timeout());
  }
  // A delegated launch follows the engine's local steps issued before it (a
  // native block launches at its end): the caller waits for them, unless the
  // operation takes its turn in the engine's launch order instead, which a
  // capture's launch cannot (it must be made on the capturing thread).
  if (runner.delegate != nullptr && membership != BlockMembership::kNative) {
    Engine* engine = madeEngines()[indexOfType(op.type)];
    if (op.launchesInTurn && !captured && launchInTurnEnabled &&
        engine != nullptr && engine->ordersLaunches()) {
      runner.inTurn = engine;
    }
    if (runner.inTurn == nullptr) {
      followEngineLaunches(op.type);
    }
  }
  // Timed unless a capture or a coalescing block decides when it runs.
  const auto interval = op.counted
      ? usage_.start(
            deviceOf(op), !captured && membership == BlockMembership::kNone)
      : nullptr;
  auto work = launch(static_cast<const Runner&>(runner));
  if (interval) {
    usage_.count(
        interval,
        op.counted->kind,
        runner.engine != nullptr ? UsagePath::kEngine : UsagePath::kDelegate,
        op.counted->reason,
        op.counted->bytes,
        work);
  }
  if (runner.seq && onGloo && work) {
    work = delegated_.watch(work, work->retrieveOpType(), *runner.seq, {});
  }
  if (work && CaptureModel::onThisThread()) {
    work = c10::make_intrusive<ModelCapturedWork>(std::move(work));
  }
  work = handOut(std::move(work), captured);
  // A native block's members launch at the block's end, so their Works are
  // not waited for; the block orders them itself.
  if (ordered && membership != BlockMembership::kNative) {
    memoryOrder_.track(op.touches, executor, work);
  }
  if (membership == BlockMembership::kCollected) {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    coalescing_->works.push_back(work);
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> Backend::handOut(
    c10::intrusive_ptr<c10d::Work> work, bool captured) {
  if (work && captured) {
    work = c10::make_intrusive<CapturedWork>(std::move(work));
  }
  return torchHooks_.report(std::move(work), captured);
}

Backend::BlockMembership Backend::joinBlock(
    const Operation& op, const Runner& runner, bool captured) {
  if (runner.delegate != nullptr && runner.delegate->supportsCoalescing() &&
      blockFollowsLaunches && coalescingBlockOpen()) {
    // NCCL's coalescing state is its group's, not a thread's: a launch made
    // in its turn on a stage thread while the block is open would join the
    // block, and two threads would be inside ProcessGroupNCCL at once. So
    // the block's members launch once every launch issued before them has
    // been made (as its end did already): afterwards none is pending, and
    // none is issued until the block ends (c10d issues a group's
    // collectives from one thread at a time).
    followEngineLaunches(op.type);
  }
  std::lock_guard<std::mutex> lock(coalescingMutex_);
  CoalescingBlock* block = openBlockLocked(op.name, op.type);
  if (block == nullptr) {
    return BlockMembership::kNone;
  }
  block->captured = block->captured || captured;
  if (runner.delegate == nullptr || !runner.delegate->supportsCoalescing()) {
    return BlockMembership::kCollected;
  }
  if (block->nativeBlock == nullptr) {
    block->nativeBlock = runner.delegate;
    runner.delegate->startCoalescing();
  }
  return BlockMembership::kNative;
}

Backend::CoalescingBlock* Backend::openBlockLocked(
    const char* opName, c10::DeviceType type) {
  if (!coalescing_) {
    return nullptr;
  }
  if (!coalescing_->type) {
    coalescing_->type = type;
  }
  TORCH_CHECK(
      *coalescing_->type == type,
      "fairring: ",
      opName,
      " on ",
      c10::DeviceTypeName(type),
      " tensors inside a coalescing block of ",
      c10::DeviceTypeName(*coalescing_->type),
      " operations; coalesce CPU and CUDA operations in separate blocks");
  return &*coalescing_;
}

c10d::Backend& Backend::cudaBackend() {
  if (auto created = cudaBackendIfCreated()) {
    return *created;
  }
  std::lock_guard<std::mutex> creating(creationMutex_);
  if (auto created = cudaBackendIfCreated()) {
    return *created;
  }
  auto made = innerGroups_->delegate(c10::kCUDA);
  TORCH_CHECK(made, "fairring: no CUDA delegate group could be made");
  if (auto device = getBoundDeviceId()) {
    made->setBoundDeviceId(device);
  }
  made->setTimeout(timeout()); // setTimeout may have changed it since
  std::lock_guard<std::mutex> lock(stateMutex_);
  cudaBackend_ = std::move(made);
  return *cudaBackend_;
}

c10::intrusive_ptr<c10d::Backend> Backend::cudaBackendIfCreated() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return cudaBackend_;
}

bool Backend::coalescingBlockOpen() {
  std::lock_guard<std::mutex> lock(coalescingMutex_);
  return coalescing_.has_value();
}

void Backend::followEngineLaunches(c10::DeviceType type) {
  // Engines live until the destructor.
  if (Engine* engine = madeEngines()[indexOfType(type)]) {
    engine->awaitLaunchesOfIssuedOps();
  }
}

c10::intrusive_ptr<c10d::Work> Backend::launchDelegated(
    const Runner& runner,
    c10d::OpType opType,
    const std::vector<at::Tensor>& tensors,
    std::function<c10::intrusive_ptr<c10d::Work>()> launch) {
  if (runner.inTurn == nullptr) {
    return launch();
  }
  return launchedInTurn(
      *runner.inTurn, std::move(launch), opType, tensors, *runner.seq);
}

c10::intrusive_ptr<c10d::Work> Backend::launchedInTurn(
    Engine& engine,
    std::function<c10::intrusive_ptr<c10d::Work>()> launch,
    c10d::OpType opType,
    const std::vector<at::Tensor>& tensors,
    uint64_t seq) {
  std::vector<c10::Device> devices;
  // Where the caller's stream stands now, at issue: the launch, later and
  // perhaps on a stage thread, follows that point and none of the caller's
  // later work (backward kernels queued since, or a graph capture begun
  // since, which a record on the caller's stream would join).
  std::shared_ptr<c10::Event> issued;
  if (!tensors.empty() && !tensors[0].is_cpu()) {
    const c10::Device device = tensors[0].device();
    devices.push_back(device);
    issued = std::make_shared<c10::Event>(device.type());
    issued->record(
        c10::impl::VirtualGuardImpl(device.type()).getStream(device));
  }
  auto work = c10::make_intrusive<InTurnWork>(opType, devices, seq);
  // The future completes on the engine's completion workers, never on the
  // stage thread that launches (its callbacks, DDP's hooks among them, may
  // block or issue collectives).
  auto settle = [&engine, work, devices](std::exception_ptr error) {
    auto failed = c10::make_intrusive<c10::ivalue::Future>(
        work->getFuture()->elementType(), devices);
    failed->setError(error);
    work->failed(std::move(error));
    engine.completeOnWorkers(failed, work->getFuture());
  };
  engine.launchInTurn(
      [&engine, work, settle, launch = std::move(launch), issued] {
        // The delegate orders itself after its launch's current stream, as
        // after the caller's when the caller launches it: here a stream of
        // torch's pool that waits for the caller's at issue.
        std::optional<c10::Stream> afterIssue;
        if (issued) {
          afterIssue = c10::impl::VirtualGuardImpl(issued->device_type())
                           .getStreamFromGlobalPool(issued->device());
          issued->block(*afterIssue);
        }
        const c10::OptionalStreamGuard onStreamAfterIssue(afterIssue);
        try {
          auto inner = launch();
          // What a synchronous operation gets from NCCL: fairring asks for a
          // Work (askingForWork), without which nothing could follow it.
          TORCH_CHECK(
              inner,
              "fairring: the delegate returned no Work for an operation "
              "launched in its turn");
          c10::intrusive_ptr<c10::ivalue::Future> theirs;
          try {
            theirs = inner->getFuture();
          } catch (const c10::Error&) {
            // Some of Gloo's Works have none and end in wait(), which must
            // run once (CompletedByWaitWork): on a completion worker.
            inner = c10::make_intrusive<CompletedByWaitWork>(std::move(inner));
            work->launched(inner);
            engine.completeOnWorkersAfterWait(inner, work->getFuture());
            return;
          }
          work->launched(std::move(inner));
          engine.completeOnWorkers(theirs, work->getFuture());
        } catch (...) {
          settle(std::current_exception());
        }
      },
      [settle](const std::string& why) {
        settle(distError(ErrorClass::kBackend, why));
      });
  return work;
}

void Backend::setLaunchInTurnForTests(bool enabled) {
  launchInTurnEnabled = enabled;
}

void Backend::setBlockFollowsLaunchesForTests(bool enabled) {
  blockFollowsLaunches = enabled;
}

uint64_t Backend::nextCollective(std::string signature) {
  std::optional<CollectiveLedger::Disagreement> found;
  const uint64_t seq = ledger_.record(std::move(signature), found);
  if (found) {
    // A neighbour that had issued it already reported it.
    failGroup(
        "the ranks issued different collectives: #" + std::to_string(seq) +
        " is '" + found->mine + "' on " + topology_.describeRank(getRank()) +
        " but '" + found->theirs + "' on " +
        topology_.describeRank(found->neighbour) + kSameCollectives);
  }
  return seq;
}

void Backend::onPeerStatus(int neighbour, std::string_view status) {
  const auto found = ledger_.compare(neighbour, status);
  if (!found) {
    return;
  }
  const std::string me = topology_.describeRank(getRank());
  const std::string them = topology_.describeRank(neighbour);
  if (found->seq == 0) {
    failGroup(them + " sent " + me + " " + found->theirs);
  } else if (found->mine != found->theirs) {
    failGroup(
        "the ranks issued different collectives: #" +
        std::to_string(found->seq) + " is '" + found->mine + "' on " + me +
        " but '" + found->theirs + "' on " + them + kSameCollectives);
  } else {
    failGroup(
        "the ranks issued different collectives before #" +
        std::to_string(found->seq) + " ('" + found->mine + "' on " + me +
        " and on " + them + ")" + kSameCollectives);
  }
}

void Backend::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalescingMutex_);
  TORCH_CHECK(
      !coalescing_,
      "fairring: startCoalescing called while a coalescing block is open");
  coalescing_.emplace();
}

c10::intrusive_ptr<c10d::Work> Backend::endCoalescing() {
  CoalescingBlock block;
  {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    TORCH_CHECK(
        coalescing_,
        "fairring: endCoalescing called without a matching startCoalescing");
    block = std::move(*coalescing_);
    coalescing_.reset();
  }
  if (block.nativeBlock != nullptr) {
    followEngineLaunches(block.type.value_or(c10::kCPU));
    // NCCL returns no Work for a block that issued nothing.
    if (auto native = block.nativeBlock->endCoalescing()) {
      block.works.push_back(std::move(native));
    }
  }
  // Each operation's own Work was reported when it was issued; NCCL's
  // block Work was not.
  if (block.works.size() == 1 && block.nativeBlock == nullptr) {
    return block.works.front();
  }
  if (block.works.size() == 1) {
    return handOut(block.works.front(), block.captured);
  }
  return handOut(
      c10::make_intrusive<AllOfWork>(
          std::move(block.works), getSequenceNumberForGroup()),
      block.captured);
}

} // namespace fairring
