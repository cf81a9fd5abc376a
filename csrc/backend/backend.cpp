#include <torch_headers.h> // first: the precompiled torch headers

#include "backend/backend.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "backend/allreduce_args.h"
#include "backend/chunked_pack.h"
#include "backend/chunked_path.h"
#include "backend/delegated.h"
#include "backend/engine_factory.h"
#include "backend/pending_report.h"
#include "backend/premul.h"
#include "backend/work.h"
#include "device/capture.h"
#include "device/emulated.h"

namespace fairring {

namespace {

// Backend::setLaunchInTurnForTests.
std::atomic<bool> launchInTurnEnabled{true};

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
      cpuBackend_(std::move(cpuBackend)),
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
        op.counted->bytes,
        work);
  }
  if (runner.seq && onGloo) {
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

const Engine* Backend::engine(c10::DeviceType type) const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return engines_[indexOfType(type)].get();
}

AllreduceRoute Backend::choosePath(const AllreduceArgs& args) {
  const AllreduceRoute route = chooseAllreducePath(
      args, topology_.servesEngine(), config_, engineSizesFor(args));
  noteIfCapturedGoesToNccl(args.captured, args.deviceType);
  return route;
}

void Backend::noteIfCapturedGoesToNccl(
    bool captured, c10::DeviceType deviceType) {
  static std::atomic<bool> noted{false}; // once per process, for every kind
  if (captured && deviceType == c10::kCUDA && config_.cudaEngine &&
      topology_.servesEngine() && !noted.exchange(true)) {
    innerGroups_->noticeOnce(
        "CUDA all-reduces, reduce-scatters and all-gathers issued during CUDA "
        "graph capture go to NCCL, which captures its own kernels: the engine "
        "waits on the host, which a graph cannot hold");
  }
}

EngineSizes Backend::engineSizesInForce(
    c10::DeviceType type, Collective kind) const {
  const size_t index = sizesIndex(type, kind);
  // The threshold first: auto stores the ceiling before it.
  const int64_t from = flatThresholds_[index].load();
  return EngineSizes{from, engineCeilings_[index].load()};
}

EngineSizes Backend::engineSizesFor(const AllreduceArgs& args) {
  const EngineSizes known = engineSizesInForce(args.deviceType);
  // Still to be measured, the sizes route as a threshold of 0 would: an
  // all-reduce the engine would not take then needs no measurement.
  if (known.fromBytes != kMeasuredThreshold ||
      chooseAllreducePath(args, topology_.servesEngine(), config_, {}).path !=
          AllreducePath::kEngine) {
    return known;
  }
  return measureEngineSizes(args.device, Collective::kAllReduce);
}

EngineSizes Backend::engineSizesFor(
    const ChunkedArgs& args, c10::Device device) {
  const EngineSizes known = engineSizesInForce(args.deviceType, args.kind);
  if (known.fromBytes != kMeasuredThreshold ||
      !chunkedOnEngine(args, topology_.servesEngine(), config_, {})) {
    return known;
  }
  return measureEngineSizes(device, args.kind);
}

EngineSizes Backend::measureEngineSizes(c10::Device device, Collective kind) {
  const size_t index = sizesIndex(device.type(), kind);
  auto& threshold = flatThresholds_[index];
  // Every rank sees the same block here (c10d's order); a captured
  // collective never reaches this (the engine takes none).
  if (coalescingBlockOpen()) {
    return {std::numeric_limits<int64_t>::max()};
  }
  std::lock_guard<std::mutex> measuring(measuringMutex_);
  if (threshold.load() != kMeasuredThreshold) {
    return engineSizesInForce(device.type(), kind);
  }
  MeasuredThreshold measured = innerGroups_->measureFlatThreshold(
      device,
      kind,
      [this, kind](at::Tensor& output, at::Tensor& input, bool onEngine) {
        collectiveOnPath(kind, output, input, onEngine);
      });
  const EngineSizes decided{measured.thresholdBytes, measured.ceilingBytes};
  TORCH_CHECK(
      decided.fromBytes >= 0 && decided.belowBytes >= decided.fromBytes,
      "fairring: the measured engine sizes [",
      decided.fromBytes,
      ", ",
      decided.belowBytes,
      ") are not a range");
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    measured_[index] = std::move(measured);
  }
  // The threshold last: a thread that reads it measured reads the ceiling.
  engineCeilings_[index].store(decided.belowBytes);
  threshold.store(decided.fromBytes);
  return decided;
}

std::optional<MeasuredThreshold> Backend::measuredThreshold(
    c10::DeviceType type, Collective kind) const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return measured_[sizesIndex(type, kind)];
}

void Backend::collectiveOnPath(
    Collective kind, at::Tensor& output, at::Tensor& input, bool onEngine) {
  if (kind == Collective::kAllReduce) {
    allreduceOnPath(output, onEngine);
  } else {
    chunkedOnPath(kind, output, input, onEngine);
  }
}

void Backend::allreduceOnPath(at::Tensor& tensor, bool onEngine) {
  std::vector<at::Tensor> tensors{tensor};
  const c10d::AllreduceOptions opts;
  const AllreduceArgs args = allreduceArgs(
      tensors, opts.reduceOp, AllreduceForm::kOne, /*nativeBlockOpen=*/false);
  const AllreduceRoute route{
      onEngine ? AllreducePath::kEngine : AllreducePath::kDelegate,
      /*premultiplyHere=*/false};
  TORCH_CHECK(
      !onEngine ||
          chooseAllreducePath(args, topology_.servesEngine(), config_, {})
                  .path == AllreducePath::kEngine,
      "fairring: the engine cannot take this all-reduce (",
      args.signature,
      ")");
  Operation op = allreduceOperation("allreduce", args, route, tensors);
  op.counted.reset(); // auto's own, not the job's
  issue(std::move(op), [&](const Runner& runner) {
    return launchAllreduce(runner, tensors, opts, route);
  })->wait();
}

// The one place engines are made: at the group's first all-reduce on the
// engine for a device type, which every rank issues at the same point of its
// sequence, so that making it (a collective step) lines up.
Engine* Backend::ensureEngine(c10::Device device) {
  const size_t index = indexOfType(device.type());
  const auto made = [&] {
    std::lock_guard<std::mutex> lock(stateMutex_);
    return engines_[index].get();
  };
  Engine* engine = made();
  if (engine == nullptr) {
    std::lock_guard<std::mutex> creating(creationMutex_);
    engine = made();
    if (engine == nullptr) {
      {
        // Connecting the engine's NCCL groups inside an open NCCL group call
        // (a native coalescing block) would wait for that block to end.
        std::lock_guard<std::mutex> lock(coalescingMutex_);
        TORCH_CHECK(
            !coalescing_ || coalescing_->nativeBlock == nullptr,
            "fairring: the group's first ",
            device.type(),
            " all-reduce was issued inside a coalescing block after a NCCL "
            "operation; the engine it creates cannot connect there. Issue "
            "one all-reduce before the block, or make the all-reduce the "
            "block's first operation.");
      }
      // What the engine tells its owner arrives on the engine's threads,
      // which it joins before it goes; the backend outlives its engines.
      Engine::Owner owner{
          [this] { return ledger_.report(); },
          [this](int neighbour, std::string_view status) {
            onPeerStatus(neighbour, status);
          },
          [this](const std::string& cause, Engine::FailureKind kind) {
            onEngineFailed(cause, kind);
          }};
      // Collective; calls into Python for the local groups.
      const ProcessCounts before = ProcessCounts::now(device);
      auto created = makeEngine(
          device,
          EngineSite{
              topology_,
              config_,
              *innerGroups_,
              store_,
              getGroupUid(),
              timeout()},
          std::move(owner));
      if (device.is_cuda() || emulatedEager_) {
        warmUp(*created);
      }
      const std::string rails = created->describeRails();
      EngineFootprint footprint = created->footprint(before);
      const std::string held = footprint.describe();
      {
        std::lock_guard<std::mutex> lock(stateMutex_);
        engines_[index] = std::move(created);
        footprints_[index] = std::move(footprint);
        engine = engines_[index].get();
      }
      innerGroups_->engineMade(device, rails, held);
    }
  }
  // One engine per device type, on the device of its first all-reduce; c10d
  // binds a rank to one device, so tensors elsewhere are unusual: the
  // delegate takes them.
  return engine->device() == device ? engine : nullptr;
}

void Backend::warmUp(Engine& engine) {
  // Zeros, so the sum needs no check; the engine's own all-reduce, not a
  // collective of the group's: the ledger and torch's hooks never see it.
  at::Tensor slice = at::zeros(
      {std::max<int64_t>(1, config_.sliceSizeBytes / 4)},
      at::TensorOptions().device(engine.device()).dtype(at::kFloat));
  engine.allreduce(slice, c10d::ReduceOp::SUM, timeout(), ledger_.issued())
      ->wait();
}

void Backend::prepareEngine(c10::Device device) {
  const bool cuda = device.is_cuda();
  const bool wanted = cuda ? config_.cudaEngine : emulatedEager_;
  // A group kept off the engine has a threshold no all-reduce reaches.
  const bool off =
      config_.flatThresholdBytes(cuda) == std::numeric_limits<int64_t>::max();
  if (!wanted || off || !topology_.servesEngine() ||
      engine(device.type()) != nullptr) {
    return;
  }
  {
    // Inside NCCL's own group call the engine's groups cannot connect: the
    // group's next CUDA collective makes it.
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    if (coalescing_ && coalescing_->nativeBlock != nullptr) {
      return;
    }
  }
  ensureEngine(device);
}

std::optional<EngineFootprint> Backend::footprint(c10::DeviceType type) const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return footprints_[indexOfType(type)];
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

c10::intrusive_ptr<c10d::Work> Backend::launchedInTurn(
    Engine& engine,
    std::function<c10::intrusive_ptr<c10d::Work>()> launch,
    c10d::OpType opType,
    const std::vector<at::Tensor>& tensors,
    uint64_t seq) {
  std::vector<c10::Device> devices;
  std::optional<c10::Stream> stream;
  if (!tensors.empty() && !tensors[0].is_cpu()) {
    const c10::Device device = tensors[0].device();
    devices.push_back(device);
    stream = c10::impl::VirtualGuardImpl(device.type()).getStream(device);
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
      [&engine, work, settle, launch = std::move(launch), stream] {
        // The caller's stream: the delegate orders itself after the caller's
        // work there, as when the caller launches it (it may also follow
        // what the caller queued since, which only delays it).
        const c10::OptionalStreamGuard onCallersStream(stream);
        try {
          auto inner = launch();
          auto theirs = inner->getFuture();
          work->launched(std::move(inner));
          engine.completeOnWorkers(theirs, work->getFuture());
        } catch (...) {
          settle(std::current_exception());
        }
      },
      [settle](const std::string& why) {
        settle(std::make_exception_ptr(std::runtime_error(why)));
      });
  return work;
}

void Backend::setLaunchInTurnForTests(bool enabled) {
  launchInTurnEnabled = enabled;
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

std::array<Engine*, 2> Backend::madeEngines() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return {engines_[0].get(), engines_[1].get()};
}

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

void Backend::failGroup(const std::string& what) {
  forEachEngine([&](Engine& engine) { engine.fail(what); });
}

void Backend::onEngineFailed(
    const std::string& cause, Engine::FailureKind kind) {
  if (!leaving_) {
    const auto type = kind == Engine::FailureKind::kTimeout
        ? c10d::ErrorType::TIMEOUT
        : kind == Engine::FailureKind::kRemote ? c10d::ErrorType::REMOTE_ERROR
                                               : c10d::ErrorType::COMM_ERROR;
    auto none = c10d::ErrorType::SUCCESS;
    failureKind_.compare_exchange_strong(none, type);
  }
  torchHooks_.runAbortHooks();
  delegated_.fail(cause);
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
  TORCH_CHECK(
      failure.empty(),
      "fairring: rank ",
      getRank(),
      ": ",
      opName,
      " not started: an earlier failure stopped the process group: ",
      failure);
}

c10::intrusive_ptr<c10d::Work> Backend::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  return issue(
      Operation::collective("broadcast", tensors), [&](const Runner& runner) {
        return runner.delegate->broadcast(tensors, opts);
      });
}

namespace {

// fairring's own Work, which completes with `future` (an engine op, or a
// Gloo op whose result is copied or unpacked afterwards).
c10::intrusive_ptr<c10d::Work> futureWork(
    c10::intrusive_ptr<c10::ivalue::Future> future,
    c10d::OpType opType,
    const char* profilingName,
    uint64_t seq,
    const std::vector<at::Tensor>& tensors) {
  return c10::make_intrusive<FutureWork>(
      std::move(future), opType, profilingName, seq, tensors);
}

// A PREMUL_SUM all-reduce scaled here, in place (the all-reduce overwrites
// its tensors anyway): returns the options of the SUM it becomes.
c10d::AllreduceOptions premultiplied(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  for (auto& tensor : tensors) {
    PremulFactor::of(opts.reduceOp, "all_reduce", tensor.scalar_type())
        .scale(tensor);
  }
  c10d::AllreduceOptions sum = opts;
  sum.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  return sum;
}

// Gloo reads and writes a CPU tensor as if it were contiguous: a view with
// gaps (t[::3], a column slice) would get wrong sums and its gaps
// overwritten. Such tensors go to Gloo as contiguous copies, copied back
// when it is done (on Gloo's thread).
c10::intrusive_ptr<c10d::Work> glooAllreduce(
    c10d::Backend& gloo,
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts,
    uint64_t seq) {
  const bool dense =
      std::all_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) {
        return t.layout() != at::kStrided || t.is_contiguous();
      });
  if (dense) {
    return gloo.allreduce(tensors, opts);
  }
  std::vector<at::Tensor> copies;
  copies.reserve(tensors.size());
  for (const auto& tensor : tensors) {
    copies.push_back(
        tensor.layout() == at::kStrided ? tensor.contiguous() : tensor);
  }
  auto work = gloo.allreduce(copies, opts);
  auto copiedBack = work->getFuture()->then(
      [tensors, copies](c10::ivalue::Future& done) {
        done.value(); // rethrows Gloo's error
        for (size_t i = 0; i < tensors.size(); ++i) {
          if (!tensors[i].is_same(copies[i])) {
            tensors[i].copy_(copies[i]);
          }
        }
        return c10::IValue(tensors);
      },
      c10::ListType::create(c10::TensorType::get()));
  return futureWork(
      copiedBack, c10d::OpType::ALLREDUCE, "fairring:all_reduce", seq, tensors);
}

// One engine all-reduce of the tensors packed end to end; the result is
// unpacked into them when it completes (on the engine's all-gather thread).
c10::intrusive_ptr<c10::ivalue::Future> packedAllreduce(
    Engine& engine,
    const std::vector<at::Tensor>& tensors,
    c10d::ReduceOp::RedOpType op,
    std::chrono::milliseconds timeout,
    uint64_t collective) {
  std::vector<at::Tensor> flattened;
  flattened.reserve(tensors.size());
  for (const auto& tensor : tensors) {
    flattened.push_back(tensor.reshape({-1}));
  }
  at::Tensor packed = at::cat(flattened);
  return engine.allreduce(packed, op, timeout, collective)
      ->then(
          [tensors, packed](c10::ivalue::Future& done) {
            done.value(); // rethrows the engine's error
            unpackInto(packed, tensors);
            return c10::IValue(tensors);
          },
          c10::ListType::create(c10::TensorType::get()));
}

} // namespace

Operation Backend::allreduceOperation(
    const char* name,
    const AllreduceArgs& args,
    const AllreduceRoute& route,
    const std::vector<at::Tensor>& tensors) {
  if (route.path == AllreducePath::kDelegateBelowThreshold) {
    ++belowThreshold_[indexOfType(args.deviceType)];
  }
  return Operation{
      .name = name,
      .type = args.deviceType,
      .signature = args.signature,
      .touches = tensors,
      .reduceOp = route.premultiplyHere ? c10d::ReduceOp(c10d::ReduceOp::SUM)
                                        : args.reduceOp,
      .reduced = tensors,
      .engineDevice = route.path == AllreducePath::kEngine
          ? std::optional(args.device)
          : std::nullopt,
      // Its launch copies what it needs: all_reduce's own (the coalesced
      // form keeps its caller's arguments, and waits).
      .launchesInTurn = std::string_view(name) == "allreduce",
      .captured = args.captured,
      .counted = Operation::Counted{Collective::kAllReduce, args.bytes}};
}

// One all-reduce, in the order it happens: its arguments checked into one
// value, the path chosen from them, then the funnel, whose launch scales a
// PREMUL_SUM here where the path says so (the tensors are free to write by
// then: memory order was awaited) and starts the engine or the delegate.
c10::intrusive_ptr<c10d::Work> Backend::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  const AllreduceArgs args = allreduceArgs(
      tensors, opts.reduceOp, AllreduceForm::kOne, coalescingBlockOpen());
  const AllreduceRoute route = choosePath(args);
  return issue(
      allreduceOperation("allreduce", args, route, tensors),
      [&](const Runner& runner) {
        return launchAllreduce(runner, tensors, opts, route);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::launchAllreduce(
    const Runner& runner,
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts,
    const AllreduceRoute& route) {
  std::vector<at::Tensor> aliases = withoutAutograd(tensors);
  const c10d::AllreduceOptions own =
      route.premultiplyHere ? premultiplied(aliases, opts) : opts;
  if (runner.engine != nullptr) {
    return futureWork(
        runner.engine->allreduce(
            aliases[0], own.reduceOp, timeoutOf(opts.timeout), *runner.seq),
        c10d::OpType::ALLREDUCE,
        "fairring:all_reduce",
        *runner.seq,
        tensors);
  }
  auto onDelegate = [delegate = runner.delegate,
                     gloo = isCpu(*runner.delegate),
                     tensors,
                     aliases,
                     own,
                     seq = *runner.seq]() mutable {
    return gloo ? glooAllreduce(*delegate, aliases, own, seq)
                : delegate->allreduce(tensors, own);
  };
  if (runner.inTurn == nullptr) {
    return onDelegate();
  }
  return launchedInTurn(
      *runner.inTurn,
      std::move(onDelegate),
      c10d::OpType::ALLREDUCE,
      tensors,
      *runner.seq);
}

// all_reduce_coalesced: the same, its tensors packed into one on the engine.
c10::intrusive_ptr<c10d::Work> Backend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  const AllreduceArgs args = allreduceArgs(
      tensors, opts.reduceOp, AllreduceForm::kCoalesced, coalescingBlockOpen());
  const AllreduceRoute route = choosePath(args);
  return issue(
      allreduceOperation("allreduce_coalesced", args, route, tensors),
      [&](const Runner& runner) {
        if (runner.engine != nullptr) {
          return futureWork(
              packedAllreduce(
                  *runner.engine,
                  withoutAutograd(tensors),
                  opts.reduceOp,
                  timeoutOf(opts.timeout),
                  *runner.seq),
              c10d::OpType::ALLREDUCE_COALESCED,
              "fairring:all_reduce_coalesced",
              *runner.seq,
              tensors);
        }
        return runner.delegate->allreduce_coalesced(tensors, opts);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return issue(
      Operation::collective("allreduce_sparse", tensors),
      [&](const Runner& runner) {
        return runner.delegate->allreduce_sparse(tensors, opts);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::reduce(
    std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  return issue(
      Operation::collective("reduce", tensors).reducing(opts.reduceOp, tensors),
      [&](const Runner& runner) {
        return runner.delegate->reduce(tensors, opts);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return issue(
      Operation::collective("allgather_coalesced", outputLists, inputs),
      [&](const Runner& runner) {
        return runner.delegate->allgather_coalesced(outputLists, inputs, opts);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return issue(
      Operation::collective("gather", outputs, inputs),
      [&](const Runner& runner) {
        return runner.delegate->gather(outputs, inputs, opts);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return issue(
      Operation::collective("scatter", outputs, inputs),
      [&](const Runner& runner) {
        return runner.delegate->scatter(outputs, inputs, opts);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::alltoall_base(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes,
    const c10d::AllToAllOptions& opts) {
  return issue(
      Operation::collective("all_to_all_single", output, input),
      [&](const Runner& runner) {
        return runner.delegate->alltoall_base(
            output, input, outputSplitSizes, inputSplitSizes, opts);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::alltoall(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  return issue(
      Operation::collective("alltoall", outputs, inputs),
      [&](const Runner& runner) {
        return isCpu(*runner.delegate)
            ? alltoallAsSingle(
                  *runner.delegate, outputs, inputs, opts, *runner.seq)
            : runner.delegate->alltoall(outputs, inputs, opts);
      });
}

// Gloo's list alltoall needs every tensor to have one shape; NCCL's does not.
// Sending the flattened lists with element splits serves any shapes.
c10::intrusive_ptr<c10d::Work> Backend::alltoallAsSingle(
    c10d::Backend& gloo,
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts,
    uint64_t seq) {
  TORCH_CHECK(
      static_cast<int>(outputs.size()) == getSize() &&
          static_cast<int>(inputs.size()) == getSize(),
      "fairring: alltoall needs one input and one output tensor per rank (",
      getSize(),
      "), got ",
      inputs.size(),
      " inputs and ",
      outputs.size(),
      " outputs");
  std::vector<at::Tensor> flatInputs;
  std::vector<int64_t> inputSplits;
  std::vector<int64_t> outputSplits;
  int64_t outputElements = 0;
  for (int peer = 0; peer < getSize(); ++peer) {
    TORCH_CHECK(
        inputs[peer].scalar_type() == inputs[0].scalar_type() &&
            outputs[peer].scalar_type() == inputs[0].scalar_type(),
        "fairring: alltoall tensors must share one dtype");
    flatInputs.push_back(inputs[peer].detach().reshape({-1}));
    inputSplits.push_back(inputs[peer].numel());
    outputSplits.push_back(outputs[peer].numel());
    outputElements += outputs[peer].numel();
  }
  at::Tensor packedInput = at::cat(flatInputs);
  at::Tensor packedOutput = at::empty({outputElements}, packedInput.options());
  auto work = gloo.alltoall_base(
      packedOutput, packedInput, outputSplits, inputSplits, opts);
  // Runs on Gloo's worker thread once the exchange is done: unpack.
  auto unpacked = work->getFuture()->then(
      [outputs = withoutAutograd(outputs), packedOutput, packedInput](
          c10::ivalue::Future& done) {
        done.value(); // rethrows the exchange's error, if any
        unpackInto(packedOutput, outputs);
        return c10::IValue(outputs);
      },
      c10::ListType::create(c10::TensorType::get()));
  return futureWork(
      unpacked, c10d::OpType::ALLTOALL, "fairring:all_to_all", seq, inputs);
}

c10::intrusive_ptr<c10d::Work> Backend::send(
    std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return issue(
      Operation::pointToPoint("send", tensors), [&](const Runner& runner) {
        return runner.delegate->send(tensors, dstRank, tag);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::recv(
    std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return issue(
      Operation::pointToPoint("recv", tensors), [&](const Runner& runner) {
        return runner.delegate->recv(tensors, srcRank, tag);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::recvAnysource(
    std::vector<at::Tensor>& tensors, int tag) {
  return issue(
      Operation::pointToPoint("recvAnysource", tensors),
      [&](const Runner& runner) {
        return runner.delegate->recvAnysource(tensors, tag);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::barrier(
    const c10d::BarrierOptions& opts) {
  return issue(
      Operation{
          .name = "barrier",
          .type = c10::kCPU,
          .signature = "barrier",
          .coalesces = false},
      [&](const Runner& runner) { return runner.delegate->barrier(opts); });
}

void Backend::monitoredBarrier(
    const c10d::BarrierOptions& opts, bool waitAllRanks) {
  // Returns nothing to watch or report: the ledger and refusal only.
  nextCollective("monitored_barrier");
  checkNotFailed("monitored_barrier");
  cpuBackend_->monitoredBarrier(opts, waitAllRanks);
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
  // and the shrunk group makes a new one at its first CUDA collective.
  c10::intrusive_ptr<c10d::Backend> cuda;
  if (auto made = cudaBackendIfCreated()) {
    if (made->supportsShrinking()) {
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
    TORCH_WARN(
        "fairring: the group goes while a dump of its failure still runs "
        "after ",
        kDumpWait.count(),
        " s; the dump may be incomplete");
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
  awaitDumps();
  stopEngines("aborted its process group", /*drain=*/false);
  delegated_.fail(
      topology_.describeRank(getRank()) + " aborted its process group");
  if (auto cuda = cudaBackendIfCreated()) {
    cuda->abort();
  }
  cpuBackend_->abort();
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
