#include "engine/engine.h"

#include <c10/util/Exception.h>

#include "engine/plan.h"
#include "engine/reduction.h"

namespace fairring {

struct Engine::Op {
  uint64_t seq;
  at::Tensor tensor; // the caller's
  at::Tensor flat; // 1-D and contiguous; aliases `tensor` unless copyBack
  bool copyBack;
  c10d::ReduceOp::RedOpType reduceOp;
  Fence inputReady; // the caller's work on the input
  ProfilerContext profiler; // the caller's, for the stage threads
  std::atomic<int64_t> slicesLeft{0};
  std::atomic<bool> settled{false};
  c10::intrusive_ptr<c10::ivalue::Future> future;

  // On the all-gather thread, after the slice's last device work was queued:
  // completion records the future's events there.
  void finishSlice() {
    if (--slicesLeft != 0 || settled.exchange(true)) {
      return;
    }
    if (copyBack) {
      tensor.copy_(flat.view(tensor.sizes()));
    }
    future->markCompleted(c10::IValue(std::vector<at::Tensor>{tensor}));
  }

  void fail(const std::exception_ptr& error) {
    if (!settled.exchange(true)) {
      future->setError(error);
    }
  }
};

struct Engine::SliceWork {
  std::shared_ptr<Op> op;
  int64_t index;
  Slice plan;
  at::Tensor input; // the slice of op->flat
  std::optional<StagingRing::Lease> lease;
  at::Tensor padded; // staging copy of a padded slice; else undefined
  at::Tensor parts; // [L, slot]: every local rank's part of my slot
  at::Tensor slot; // parts[0]
  at::Tensor shards; // [machines, shard]: every machine's part of my shard
  Fence reduceScattered; // steps 1 done, shards[me] copied
  Fence reduced; // step 3 done
  // Guarded by the engine's mutex_.
  int shardsReceived = 0;
  int reducedReceived = 0;
  int writesPending = 0;
  Fence shardsArrived; // the latest arrival covers every earlier one
  Fence reducedArrived;

  // Step 1's input and step 5's output.
  at::Tensor io() const {
    return padded.defined() ? padded : input;
  }
  std::string describe() const {
    return "op #" + std::to_string(op->seq) + " slice " + std::to_string(index);
  }
  // Names everything both ends must agree on, so that ranks that issued
  // different all-reduces fail instead of reducing mismatched data.
  std::string tag(rails::Lane lane) const {
    return std::to_string(static_cast<int>(lane)) + ":" +
        std::to_string(op->seq) + ":" + std::to_string(index) + ":" +
        c10::toString(input.scalar_type()) + ":" +
        std::to_string(static_cast<int>(op->reduceOp));
  }
};

Engine::Engine(
    const Topology& topology,
    const Config& config,
    std::unique_ptr<DeviceContext> device,
    std::unique_ptr<rails::Mesh> mesh,
    std::unique_ptr<Timeline> timeline)
    : topology_(topology),
      config_(config),
      device_(std::move(device)),
      timeline_(std::move(timeline)),
      staging_(config.totalMemoryBytes, device_->memoryOptions()) {
  TORCH_CHECK(
      topology_.servesEngine(),
      "fairring: the engine needs 2+ machines with equally many ranks");
  device_->keepAlive(staging_.memory());
  lanes_ = std::make_unique<rails::Lanes>(
      std::move(mesh), [this](const std::string& message) { fail(message); });
  // One thread per stage, owned by the engine and joined by its destructor.
  const std::array<void (Engine::*)(), kStages> loops{
      &Engine::reduceScatterLoop, &Engine::reduceLoop, &Engine::allGatherLoop};
  for (int stage = 0; stage < kStages; ++stage) {
    threads_[stage] = std::thread([this, stage, loop = loops[stage]] {
      try {
        device_->runStage(static_cast<Stage>(stage), [&] { (this->*loop)(); });
      } catch (const std::exception& error) {
        fail(
            std::string("the ") + stageName(static_cast<Stage>(stage)) +
            " stage failed: " + error.what());
      }
    });
  }
}

Engine::~Engine() {
  abort("the process group was shut down");
  for (auto& thread : threads_) {
    thread.join();
  }
  // Shuts the transport down: no callback runs after this. Staging is freed
  // next; on CUDA, the device context kept it from reuse until the work
  // queued on it has finished, so nothing here waits for the GPU.
  lanes_.reset();
}

bool Engine::handles(const at::Tensor& tensor, c10d::ReduceOp::RedOpType op) {
  return reductionSupported(tensor.scalar_type(), op);
}

c10::intrusive_ptr<c10::ivalue::Future> Engine::allreduce(
    const at::Tensor& tensor,
    c10d::ReduceOp::RedOpType reduceOp) {
  auto op = std::make_shared<Op>();
  op->tensor = tensor;
  op->copyBack = !tensor.is_contiguous();
  op->flat = tensor.contiguous().view({-1});
  op->reduceOp = reduceOp;
  op->profiler = ProfilerContext::capture();
  op->future = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), device_->futureDevices());

  const int64_t elementSize = op->flat.element_size();
  const int64_t unit = planUnit(
      topology_.localSize(),
      topology_.numMachines(),
      elementSize,
      device_->minShardBytes());
  const auto plan = makePlan(
      op->flat.numel(),
      sliceNumelFor(
          sliceBytesFor(op->flat.numel() * elementSize, config_.sliceSizeBytes),
          elementSize,
          unit),
      unit);
  op->slicesLeft = static_cast<int64_t>(plan.size());
  if (plan.empty()) {
    op->seq = nextSeq_++;
    op->slicesLeft = 1;
    op->finishSlice();
    return op->future;
  }
  op->inputReady = device_->adoptInput(op->flat, op->tensor);

  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Numbered under the lock that queues its slices: numbers follow queue order.
    op->seq = nextSeq_++;
    if (!error_.empty()) {
      op->fail(std::make_exception_ptr(std::runtime_error(
          "fairring: all_reduce op #" + std::to_string(op->seq) +
          " not started: an earlier failure stopped the engine: " + error_)));
      return op->future;
    }
    std::erase_if(liveOps_, [](const auto& weak) { return weak.expired(); });
    liveOps_.push_back(op);
    for (size_t i = 0; i < plan.size(); ++i) {
      auto slice = std::make_shared<SliceWork>();
      slice->op = op;
      slice->index = static_cast<int64_t>(i);
      slice->plan = plan[i];
      slice->input = op->flat.narrow(0, plan[i].offset, plan[i].numel);
      toReduceScatter_.push_back(std::move(slice));
    }
  }
  progress_.notify_all();
  return op->future;
}

// The reduce-scatter thread: start, steps 1 and 2, in issue order.
void Engine::reduceScatterLoop() {
  while (auto slice = popWhenReady(
             toReduceScatter_, [](const SliceWork&) { return true; })) {
    if (!traced(Stage::kReduceScatter, *slice, [&] {
          return start(slice) && reduceScatter(slice);
        })) {
      return;
    }
    push(toReduce_, slice);
  }
}

// The reduce thread: steps 3 and 4, once every machine's shard is here.
void Engine::reduceLoop() {
  const int peers = topology_.numMachines() - 1;
  while (auto slice = popWhenReady(toReduce_, [peers](const SliceWork& s) {
           return s.shardsReceived == peers;
         })) {
    if (!traced(Stage::kReduce, *slice, [&] { return reduce(slice); })) {
      return;
    }
    push(toAllGather_, slice);
  }
}

// The all-gather thread: step 5, once every reduced shard is here and the
// rails are done reading this slice's staging.
void Engine::allGatherLoop() {
  const int peers = topology_.numMachines() - 1;
  while (auto slice = popWhenReady(toAllGather_, [peers](const SliceWork& s) {
           return s.reducedReceived == peers && s.writesPending == 0;
         })) {
    if (traced(Stage::kAllGather, *slice, [&] { return allGather(slice); })) {
      slice->op->finishSlice();
    }
  }
}

// Staging for the slice, and the messages it will receive on both lanes.
bool Engine::start(const std::shared_ptr<SliceWork>& slice) {
  const auto cancelled = [this] { return failed(); };
  const int64_t elementSize = slice->input.element_size();
  const auto layout = stagingLayoutFor(
      slice->plan.paddedNumel * elementSize,
      topology_.localSize(),
      topology_.numMachines(),
      slice->plan.padded());
  auto lease = staging_.acquire(layout.bytes, cancelled);
  if (!lease) {
    return false;
  }
  Fence previousUse;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    previousUse = lastReleased_;
  }
  // The memory's last users (older slices, all released) must be done with
  // it on the device before anything writes it, the rails included.
  if (!device_->waitOnHost(previousUse, cancelled)) {
    return false;
  }
  attachStaging(*slice, std::move(*lease), layout);
  expectMessages(slice);
  return true;
}

void Engine::attachStaging(
    SliceWork& slice,
    StagingRing::Lease lease,
    const StagingLayout& layout) {
  const int localSize = topology_.localSize();
  const auto dtype = slice.input.scalar_type();
  const int64_t elementSize = slice.input.element_size();
  const int64_t paddedNumel = slice.plan.paddedNumel;
  const int64_t slotNumel = paddedNumel / localSize;
  at::Tensor bytes = lease.bytes();
  auto view = [&](int64_t offset, int64_t numel) {
    return bytes.narrow(0, offset, numel * elementSize).view(dtype);
  };
  slice.parts = view(0, localSize * slotNumel).view({localSize, slotNumel});
  slice.slot = slice.parts[0];
  slice.shards = view(layout.shardsOffset, slotNumel)
                     .view({topology_.numMachines(), -1});
  if (slice.plan.padded()) {
    slice.padded = view(layout.paddedOffset, paddedNumel);
  }
  slice.lease.emplace(std::move(lease));
}

// Steps 1 and 2. Step 1 is an all-to-all of slots and a local combination
// (Gloo's own reduce-scatter takes 2-3x as long on the same data).
bool Engine::reduceScatter(const std::shared_ptr<SliceWork>& slice) {
  try {
    if (slice->index == 0) {
      device_->waitOnDevice(slice->op->inputReady);
    }
    if (slice->padded.defined()) {
      const int64_t numel = slice->plan.numel;
      slice->padded.narrow(0, 0, numel).copy_(slice->input);
      slice->padded.narrow(0, numel, slice->plan.paddedNumel - numel).zero_();
    }
    at::Tensor input = slice->io();
    device_->localAllToAll(slice->parts, input);
    const auto op = localReduceOp(slice->op->reduceOp);
    for (int64_t part = 1; part < slice->parts.size(0); ++part) {
      combineInto(slice->slot, slice->parts[part], op);
    }
    const int me = topology_.machine();
    slice->shards[me].copy_(shardOf(*slice, me));
    slice->reduceScattered = device_->record();
  } catch (const std::exception& error) {
    fail("local reduce-scatter of " + slice->describe() + " failed: " + error.what());
    return false;
  }
  // The rails read the slot from the host's side: it must be ready.
  if (!device_->waitOnHost(slice->reduceScattered, [this] { return failed(); })) {
    return false;
  }
  for (int machine = 0; machine < topology_.numMachines(); ++machine) {
    if (machine != topology_.machine()) {
      send(slice, rails::kShards, machine, shardOf(*slice, machine));
    }
  }
  return true;
}

// Steps 3 and 4.
bool Engine::reduce(const std::shared_ptr<SliceWork>& slice) {
  const int me = topology_.machine();
  try {
    device_->waitOnDevice(slice->reduceScattered);
    device_->waitOnDevice(slice->shardsArrived);
    at::Tensor out = shardOf(*slice, me);
    reduceRows(out, slice->shards, slice->op->reduceOp, topology_.worldSize());
    slice->reduced = device_->record();
  } catch (const std::exception& error) {
    fail("reducing " + slice->describe() + " failed: " + error.what());
    return false;
  }
  if (!device_->waitOnHost(slice->reduced, [this] { return failed(); })) {
    return false;
  }
  for (int machine = 0; machine < topology_.numMachines(); ++machine) {
    if (machine != me) {
      send(slice, rails::kReduced, machine, shardOf(*slice, me));
    }
  }
  return true;
}

// Step 5; then the staging goes back.
bool Engine::allGather(const std::shared_ptr<SliceWork>& slice) {
  Fence done;
  try {
    device_->waitOnDevice(slice->reduced);
    device_->waitOnDevice(slice->reducedArrived);
    at::Tensor output = slice->io();
    device_->localAllGather(output, slice->slot);
    if (slice->padded.defined()) {
      slice->input.copy_(slice->padded.narrow(0, 0, slice->plan.numel));
    }
    done = device_->record();
  } catch (const std::exception& error) {
    fail("local all-gather of " + slice->describe() + " failed: " + error.what());
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lastReleased_ = done; // before the lease: whoever gets it sees this
  }
  slice->lease.reset();
  ++slicesDone_;
  return true;
}

template <typename Step>
bool Engine::traced(Stage stage, const SliceWork& slice, Step&& step) {
  const StageSpan span(
      timeline_.get(),
      slice.op->profiler,
      stage,
      slice.op->seq,
      slice.index,
      slice.plan.numel * slice.input.element_size());
  return step();
}

at::Tensor Engine::shardOf(const SliceWork& slice, int machine) const {
  const int64_t shardNumel = slice.slot.numel() / topology_.numMachines();
  return slice.slot.narrow(0, machine * shardNumel, shardNumel);
}

void Engine::expectMessages(const std::shared_ptr<SliceWork>& slice) {
  // Run on the transport's thread(s): count, note the fence, wake the
  // stages. The fence is recorded under the lock, so the one kept last was
  // recorded last: after every copy whose receive completed before it.
  auto arrival = [this, slice](rails::Lane lane) {
    return [this, slice, lane] {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        Fence fence = device_->receivedFence();
        if (lane == rails::kShards) {
          ++slice->shardsReceived;
          slice->shardsArrived = std::move(fence);
        } else {
          ++slice->reducedReceived;
          slice->reducedArrived = std::move(fence);
        }
      }
      progress_.notify_all();
    };
  };
  for (int machine = 0; machine < topology_.numMachines(); ++machine) {
    if (machine == topology_.machine()) {
      continue;
    }
    lanes_->expect(
        machine,
        rails::kShards,
        {slice->tag(rails::kShards),
         device_->receiveBuffer(slice->shards[machine]),
         "shards of " + slice->describe(),
         arrival(rails::kShards)});
    lanes_->expect(
        machine,
        rails::kReduced,
        {slice->tag(rails::kReduced),
         device_->receiveBuffer(shardOf(*slice, machine)),
         "reduced shards of " + slice->describe(),
         arrival(rails::kReduced)});
  }
}

void Engine::send(
    const std::shared_ptr<SliceWork>& slice,
    rails::Lane lane,
    int machine,
    const at::Tensor& shard) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++slice->writesPending;
  }
  lanes_->send(
      machine,
      lane,
      slice->tag(lane),
      device_->sendBuffer(shard),
      (lane == rails::kShards ? "shards of " : "reduced shards of ") +
          slice->describe(),
      // On the transport's thread, once the rails are done with the memory.
      [this, slice] {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          --slice->writesPending;
        }
        progress_.notify_all();
      });
}

std::shared_ptr<Engine::SliceWork> Engine::popWhenReady(
    Queue& queue,
    const std::function<bool(const SliceWork&)>& ready) {
  std::unique_lock<std::mutex> lock(mutex_);
  progress_.wait(lock, [&] {
    return !error_.empty() || (!queue.empty() && ready(*queue.front()));
  });
  if (!error_.empty()) {
    return nullptr;
  }
  auto slice = std::move(queue.front());
  queue.pop_front();
  return slice;
}

void Engine::push(Queue& queue, std::shared_ptr<SliceWork> slice) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue.push_back(std::move(slice));
  }
  progress_.notify_all();
}

void Engine::abort(const std::string& reason) {
  fail(reason);
  device_->abort();
}

void Engine::fail(const std::string& message) {
  std::vector<std::shared_ptr<Op>> ops;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_.empty()) {
      return;
    }
    error_ = "rank " + std::to_string(topology_.rank()) + ": " + message;
    failed_ = true;
    for (const auto& weak : liveOps_) {
      if (auto op = weak.lock()) {
        ops.push_back(std::move(op));
      }
    }
  }
  progress_.notify_all();
  staging_.interrupt();
  lanes_->close(message);
  const auto error = std::make_exception_ptr(std::runtime_error(
      "fairring: rank " + std::to_string(topology_.rank()) + ": " + message));
  for (const auto& op : ops) {
    op->fail(error);
  }
}

EngineStats Engine::stats() const {
  return EngineStats{
      static_cast<int64_t>(nextSeq_.load()),
      slicesDone_.load(),
      lanes_->bytesSent(),
      lanes_->bytesReceived()};
}

} // namespace fairring
