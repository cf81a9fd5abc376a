#include <torch_headers.h> // first: the precompiled torch headers

#include "engine/engine.h"

#include <algorithm>

#include <c10/util/Exception.h>

#include "device/capture.h"
#include "engine/ops.h"
#include "engine/plan.h"
#include "reduction.h"
#include "log.h"
#include "thread_name.h"

namespace fairring {

namespace {

std::vector<int> sendOrderOf(const Topology& topology) {
  const int machines = topology.numMachines();
  std::vector<int> order;
  order.reserve(machines - 1);
  for (int step = 1; step < machines; ++step) {
    order.push_back((topology.machine() + step) % machines);
  }
  return order;
}

} // namespace

Engine::Engine(
    const Topology& topology,
    const Config& config,
    std::unique_ptr<DeviceContext> device,
    std::shared_ptr<LocalSteps> localSteps,
    std::unique_ptr<rails::Mesh> mesh,
    std::chrono::milliseconds timeout,
    std::unique_ptr<Timeline> timeline,
    Owner owner)
    : topology_(topology),
      config_(config),
      localSteps_(std::move(localSteps)),
      device_(std::move(device)),
      timeline_(std::move(timeline)),
      owner_(std::move(owner)),
      heartbeatInterval_(heartbeatIntervalFor(timeout)),
      planSettings_{
          topology.localSize(),
          topology.numMachines(),
          device_->minShardBytes(),
          config.sliceSizeBytes,
          config.minShardBytes,
          config.totalMemoryBytes,
          config.maxSlicesInFlight},
      sendOrder_(sendOrderOf(topology)),
      staging_(stagingCapacity(planSettings_), device_->memoryOptions()),
      launchesAhead_(device_->launchesAhead()),
      completions_(std::make_shared<Completions>(device_->device())),
      mesh_(std::move(mesh)),
      // With one rank per machine no local step waits for another rank.
      launchOrder_(device_->mayRunInLaunchOrder() && topology.localSize() > 1) {
  TORCH_CHECK(
      topology_.servesEngine(),
      "fairring: the engine needs 2+ machines with equally many ranks");
  if (!topology_.layout().empty()) {
    adoptLayout(topology_.layout());
  }
  device_->adoptStaging(staging_.memory());
  if (launchesAhead_) {
    railsStaging_ = at::empty(
        {staging_.memory().numel()},
        device_->railsMemoryOptions().dtype(at::kByte));
  }
  const at::Tensor& staging =
      launchesAhead_ ? railsStaging_ : staging_.memory();
  mesh_->registerStaging(
      rails::Buffer{
          staging.data_ptr(),
          static_cast<size_t>(staging.nbytes()),
          staging.device(),
          std::nullopt});
  // Kept sends hold their staging until acknowledged (Engine::send); under
  // the launch order an op's first slice then waits for an empty ring
  // (Engine::start).
  const bool resends = mesh_->resends();
  const bool switches = resends && rails::RailFailover::possible(*mesh_);
  lanes_ = std::make_unique<rails::Lanes>(
      *mesh_,
      [this](int peerRank, bool mismatch, const std::string& message) {
        onRailsFailure(peerRank, mismatch, message);
      },
      resends ? rails::Lanes::Broken(
                    [this](int machine, const std::string& message) {
                      const int peer = topology_.railPeers()[machine];
                      auto fail = [this, peer, message] {
                        lanes_->failPeer(peer, message);
                      };
                      if (failover_) {
                        failover_->broken(machine, std::move(fail));
                      } else {
                        fail(); // no spare here: nothing to switch to
                      }
                    })
              : nullptr);
  watch_ = std::make_unique<rails::Watch>(
      *mesh_,
      topology_.worldSize(),
      rails::Watch::Handlers{
          [this](int neighbour, const rails::Watch::Notice& notice) {
            onNotice(neighbour, notice);
          },
          [this](int neighbour, const std::string& error) {
            const int machine = topology_.machineOf(neighbour);
            if (failover_ && machine != topology_.machine()) {
              failover_->broken(machine, [this, neighbour, error] {
                onLost(neighbour, error);
              });
              return;
            }
            onLost(neighbour, error);
          },
          [this](int neighbour) { onBye(neighbour); },
          [this](int neighbour, std::string_view status) {
            if (owner_.onPeerStatus) {
              owner_.onPeerStatus(neighbour, status);
            }
          },
          [this](int neighbour, const std::string& text) {
            return onRailsNote(neighbour, text);
          }});
  if (switches) {
    failover_ = std::make_unique<rails::RailFailover>(
        *mesh_,
        *lanes_,
        *watch_,
        topology_,
        failoverSettings(timeout),
        rails::RailFailover::Hooks{[](const std::string& line, bool warning) {
          notice(
              warning ? LogLevel::kWarning : LogLevel::kInfo,
              "fairring: " + line);
        }});
  }
  watch_->start();
  if (launchesAhead_) {
    follower_ = std::make_unique<DeviceFollower>(*device_);
  }
  // One thread per stage and the watchdog, owned by the engine and joined by
  // its destructor.
  const std::array<void (Engine::*)(), kStages> loops{
      &Engine::reduceScatterLoop, &Engine::reduceLoop, &Engine::allGatherLoop};
  for (int stage = 0; stage < kStages; ++stage) {
    threads_[stage] = std::thread([this, stage, loop = loops[stage]] {
      static constexpr std::array<const char*, kStages> kNames{
          "fr-rs-stage", "fr-reduce-stage", "fr-ag-stage"};
      nameThisThread(kNames[stage]);
      // Its CUDA calls, and the delegate launches it makes in their turn,
      // touch no stream a caller captures (captured collectives never reach
      // the engine): they must not invalidate a capture that another thread
      // runs in CUDA's global mode. Only a CUDA engine's: the call would
      // make a CPU engine's process a CUDA context.
      if (this->device().is_cuda()) {
        relaxCaptureChecksOnThisThread();
      }
      try {
        (this->*loop)();
      } catch (const std::exception& error) {
        Cause cause = Cause::secondHand(
            who(topology_.rank()) + "'s " +
            stageName(static_cast<Stage>(stage)) +
            " stage failed: " + error.what());
        cause.kind = FailureKind::kLocal;
        stop(std::move(cause));
      }
    });
  }
  watchdog_ = std::thread([this] {
    nameThisThread("fr-watchdog");
    watchdogLoop();
  });
}

Engine::~Engine() {
  leave("destroyed its process group");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  watchdogWake_.notify_all();
  for (auto& thread : threads_) {
    thread.join();
  }
  watchdog_.join();
  if (follower_) {
    follower_->stop(); // the stage threads posted to it
  }
  if (failover_) {
    failover_->shutdown(); // its switches use the mesh, lanes and watch
  }
  // The device's own threads (an emulated device's streams) run work that
  // uses this engine: none runs after this.
  device_->join();
  localSteps_->join();
  // Shuts the transport down: no callback runs after this. Then the watch,
  // the lanes, the mesh and the completions go (the last runs what is
  // queued), and staging is freed; on CUDA, the device context kept it from
  // reuse until the work queued on it has finished, so nothing here waits
  // for the GPU.
  mesh_->shutdown();
}

Engine::Started Engine::allreduce(
    const at::Tensor& tensor,
    c10d::ReduceOp::RedOpType reduceOp,
    std::chrono::milliseconds timeout,
    uint64_t collective) {
  auto op = makeOp(
      Collective::kAllReduce, tensor, tensor, reduceOp, timeout, collective);
  const auto shape = planShape(
      op->elements.numel(), op->elements.element_size(), planSettings_);
  return issue(
      op, makePlan(op->elements.numel(), shape.sliceNumel, shape.unit));
}

Engine::Started Engine::reduceScatter(
    const at::Tensor& input,
    const at::Tensor& output,
    c10d::ReduceOp::RedOpType reduceOp,
    std::chrono::milliseconds timeout,
    uint64_t collective) {
  auto op = makeOp(
      Collective::kReduceScatter, input, output, reduceOp, timeout, collective);
  return issue(op, chunkPlan(op->chunkNumel, input.element_size()));
}

Engine::Started Engine::allGather(
    const at::Tensor& input,
    const at::Tensor& output,
    std::chrono::milliseconds timeout,
    uint64_t collective) {
  auto op = makeOp(
      Collective::kAllGather,
      input,
      output,
      c10d::ReduceOp::SUM,
      timeout,
      collective);
  return issue(op, chunkPlan(op->chunkNumel, input.element_size()));
}

bool Engine::knowsLayout() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rowRanks_.defined();
}

void Engine::adoptLayout(const std::vector<std::vector<int>>& machines) {
  const Topology whole = topology_.withLayout(machines); // checks it
  const int count = topology_.numMachines();
  std::vector<int64_t> rows(topology_.worldSize());
  for (int m = 0; m < count; ++m) {
    for (int l = 0; l < topology_.localSize(); ++l) {
      rows[l * count + m] = whole.layout()[m][l];
    }
  }
  at::Tensor onDevice = at::tensor(rows, at::kLong).to(device_->device());
  std::lock_guard<std::mutex> lock(mutex_);
  rowRanks_ = std::move(onDevice);
  rowRankList_ = std::move(rows);
}

std::shared_ptr<Engine::Op> Engine::makeOp(
    Collective kind,
    const at::Tensor& input,
    const at::Tensor& tensor,
    c10d::ReduceOp::RedOpType reduceOp,
    std::chrono::milliseconds timeout,
    uint64_t collective) {
  TORCH_CHECK(
      !input.requires_grad() && !tensor.requires_grad(),
      "fairring: the engine got a tensor that requires grad; pass "
      "tensor.detach()");
  auto op = std::make_shared<Op>();
  op->kind = kind;
  op->collective = collective;
  op->tensor = tensor;
  if (kind == Collective::kAllReduce) {
    op->copyBack = !tensor.is_contiguous();
    op->elements = tensor.contiguous().view({-1});
  } else {
    TORCH_CHECK(
        knowsLayout(),
        "fairring: the engine was not given the group's layout, which a ",
        collectiveName(kind),
        " needs");
    TORCH_CHECK(
        input.is_contiguous() && tensor.is_contiguous(),
        "fairring: the engine's ",
        collectiveName(kind),
        " needs contiguous tensors");
    const int64_t world = topology_.worldSize();
    const auto& chunked = kind == Collective::kReduceScatter ? input : tensor;
    const auto& chunk = kind == Collective::kReduceScatter ? tensor : input;
    TORCH_CHECK(
        chunked.numel() == chunk.numel() * world,
        "fairring: the engine's ",
        collectiveName(kind),
        " needs a tensor of ",
        world,
        " x ",
        chunk.numel(),
        " elements, got ",
        chunked.numel());
    op->elements = input.view({-1});
    op->chunkNumel = chunk.numel();
  }
  const auto index = static_cast<size_t>(kind);
  opsByKind_[index].fetch_add(1);
  bytesByKind_[index].fetch_add(
      std::max(input.numel(), tensor.numel()) * tensor.element_size());
  op->reduceOp = reduceOp;
  op->timeout = timeout;
  op->deadline = Clock::now() + timeout;
  op->profiler = ProfilerContext::capture();
  op->future = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), device_->futureDevices());
  return op;
}

std::vector<Slice> Engine::chunkPlan(
    int64_t chunkNumel, int64_t elementSize) const {
  // An all-reduce of every rank's chunk, cut so that each slice holds the
  // same columns of every chunk: its unit and slice length in columns.
  const int64_t world = topology_.worldSize();
  const auto shape = planShape(chunkNumel * world, elementSize, planSettings_);
  return makePlan(chunkNumel, shape.sliceNumel / world, shape.unit / world);
}

Engine::Started Engine::issue(
    const std::shared_ptr<Op>& op, const std::vector<Slice>& plan) {
  Started result{completions_->relay(op->future), nullptr};
  op->slicesLeft = static_cast<int64_t>(plan.size());
  if (plan.empty()) {
    // Numbered with the others, so that the numbers follow queue order; it
    // releases nothing: its Work's waiter waits on the host, for nothing.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      op->seq = nextSeq_++;
    }
    op->slicesLeft = 1;
    op->finishSlice();
    return result;
  }
  op->inputReady = device_->adoptInput(op->elements, op->tensor);
  const int64_t rows =
      op->kind == Collective::kAllReduce ? 1 : topology_.worldSize();
  const int64_t window = launchOrder_.enforced()
      ? launchWindow(plan, rows, op->elements.element_size())
      : 1;

  const int peers = topology_.numMachines() - 1;
  std::vector<std::shared_ptr<SliceWork>> slices;
  for (size_t i = 0; i < plan.size(); ++i) {
    auto slice = std::make_shared<SliceWork>();
    slice->op = op;
    slice->index = static_cast<int64_t>(i);
    slice->plan = plan[i];
    slice->rows = rows;
    if (op->kind == Collective::kAllReduce) {
      slice->input = op->elements.narrow(0, plan[i].offset, plan[i].numel);
    }
    // A lane the collective does not use counts as arrived.
    const bool noShards = op->kind == Collective::kAllGather;
    const bool noReduced = op->kind == Collective::kReduceScatter;
    slice->shardFrom.assign(topology_.numMachines(), noShards ? 1 : 0);
    slice->reducedFrom.assign(topology_.numMachines(), noReduced ? 1 : 0);
    slice->shardsReceived = noShards ? peers : 0;
    slice->reducedReceived = noReduced ? peers : 0;
    slice->sendsTo.assign(topology_.numMachines(), 0);
    op->slices.push_back(slice);
    slices.push_back(std::move(slice));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Numbered under the lock that queues its slices: numbers follow queue
    // order.
    op->seq = nextSeq_++;
    if (!error_.empty()) {
      op->fail(
          "fairring: rank " + std::to_string(topology_.rank()) + ": " +
              op->describe() +
              " not started: an earlier failure stopped the engine: " + error_,
          ErrorClass::kBackend);
      return result; // failed: its Work's waiter throws
    }
    if (launchesAhead_) {
      op->launchEnd = std::make_shared<LaunchEnd>();
      if (auto waiter = device_->callerWaiter()) {
        // Waits on the host only for the op's launches, which wait for no
        // rails (docs/design.md, "The host never waits").
        result.holdCaller = [end = op->launchEnd, waiter = std::move(waiter)] {
          const std::optional<Fence> done = end->await();
          return done.has_value() && waiter(*done);
        };
      }
    }
    liveOps_.push_back(op);
    if (failed()) {
      if (op->launchEnd) {
        op->launchEnd->stopped(); // stop() may have passed the live ops
      }
      return result; // stopped: fails once the cause is settled
    }
    launchOrder_.issued(op->seq, static_cast<int64_t>(slices.size()), window);
    for (auto& slice : slices) {
      toReduceScatter_.push_back(std::move(slice));
    }
  }
  progress_.notify_all();
  watchdogWake_.notify_all(); // its deadline may be the nearest
  return result;
}

int64_t Engine::launchWindow(
    const std::vector<Slice>& plan, int64_t rows, int64_t elementSize) const {
  std::vector<int64_t> leaseBytes;
  leaseBytes.reserve(plan.size());
  for (const Slice& slice : plan) {
    leaseBytes.push_back(leaseLayout(slice, rows, elementSize).bytes);
  }
  return stagingWindow(staging_.capacity(), leaseBytes);
}

StagingLayout Engine::leaseLayout(
    const Slice& plan, int64_t rows, int64_t elementSize) const {
  return stagingLayoutFor(
      plan.paddedNumel * rows * elementSize,
      topology_.localSize(),
      topology_.numMachines(),
      stagedInCopy(plan, rows));
}

void Engine::launched(LaunchOrder::Step step) {
  if (!launchOrder_.enforced()) {
    return; // nobody waits for a turn
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    launchOrder_.launched(step);
  }
  progress_.notify_all();
  launchDueForeign();
}

void Engine::launchInTurn(
    std::function<void()> launch,
    std::function<void(const std::string&)> failed) {
  if (!launchOrder_.enforced()) {
    launch(); // launches need no order
    return;
  }
  std::string stopped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) {
      stopped =
          error_.empty() ? std::string("its failure is being settled") : error_;
    } else {
      launchOrder_.issuedForeign();
      foreign_.push_back(ForeignLaunch{std::move(launch), std::move(failed)});
    }
  }
  if (!stopped.empty()) {
    failed(
        "fairring: rank " + std::to_string(topology_.rank()) +
        ": not launched: the engine, which orders this group's launches, "
        "stopped: " +
        stopped);
    return;
  }
  launchDueForeign(); // at once if its turn has come
}

void Engine::launchDueForeign() {
  while (true) {
    ForeignLaunch next;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (foreignRunning_ || failed() || !launchOrder_.foreignNext()) {
        return;
      }
      foreignRunning_ = true;
      next = std::move(foreign_.front());
      foreign_.pop_front();
    }
    next.launch();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      foreignRunning_ = false;
      launchOrder_.launchedForeign();
    }
    progress_.notify_all();
  }
}

std::chrono::milliseconds Engine::heartbeatIntervalFor(
    std::chrono::milliseconds timeout) {
  return std::clamp(
      timeout / 10,
      std::chrono::milliseconds(100),
      std::chrono::milliseconds(5000));
}

rails::RailFailover::Settings Engine::failoverSettings(
    std::chrono::milliseconds timeout) {
  const auto interval = heartbeatIntervalFor(timeout);
  return {timeout, 3 * interval, interval, std::chrono::milliseconds(100)};
}

void Engine::setTimeout(std::chrono::milliseconds timeout) {
  localSteps_->setTimeout(timeout);
  heartbeatInterval_ = heartbeatIntervalFor(timeout); // from its next beat
  if (failover_) {
    failover_->retime(failoverSettings(timeout));
  }
}

void Engine::awaitLaunchesOfIssuedOps() {
  std::unique_lock<std::mutex> lock(mutex_);
  progress_.wait(lock, [this] { return failed() || launchOrder_.drained(); });
}
EngineStats Engine::stats() const {
  EngineStats stats{
      static_cast<int64_t>(nextSeq_.load()),
      slicesDone_.load(),
      lanes_->bytesSent(),
      lanes_->bytesReceived(),
      localSteps_->name(),
      {},
      {}};
  for (size_t kind = 0; kind < stats.opsByKind.size(); ++kind) {
    stats.opsByKind[kind] = opsByKind_[kind].load();
    stats.bytesByKind[kind] = bytesByKind_[kind].load();
  }
  return stats;
}

EngineFootprint Engine::footprint(const ProcessCounts& before) const {
  const int64_t dataConnections =
      static_cast<int64_t>(topology_.numMachines() - 1) * rails::kLanes;
  return footprintOf(
      device(),
      staging_.capacity(),
      mesh_->pinnedHostBytes() +
          (railsStaging_.defined() ? railsStaging_.nbytes() : 0),
      dataConnections + static_cast<int64_t>(mesh_->neighbours().size()),
      before,
      ProcessCounts::now(device()));
}

} // namespace fairring
