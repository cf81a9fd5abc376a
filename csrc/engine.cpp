#include "engine.h"

#include <ATen/ops/amax.h>
#include <ATen/ops/amin.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/prod.h>
#include <ATen/ops/sum.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <tensorpipe/tensorpipe.h>

#include "cuda_support.h"
#include "plan.h"

namespace fairring {

namespace {

// Local steps of AVG sum; the division happens once, on the reduced shard.
c10d::ReduceOp::RedOpType localOp(c10d::ReduceOp::RedOpType op) {
  return op == c10d::ReduceOp::AVG ? c10d::ReduceOp::SUM : op;
}

const char* laneName(Rails::Lane lane) {
  return lane == Rails::kShards ? "shards" : "reduced shards";
}

// A stream of the engine's own on a CUDA device; none on the CPU.
std::optional<c10::Stream> engineStreamFor(c10::Device device) {
  if (device.is_cpu()) {
    return std::nullopt;
  }
  return c10::impl::VirtualGuardImpl(device.type())
      .getStreamFromGlobalPool(device);
}

// Work queued on `stream` from now on runs after the work queued so far on
// the current stream of its device; neither host thread waits.
void orderAfterCurrentStream(const c10::Stream& stream) {
  const c10::impl::VirtualGuardImpl guard(stream.device_type());
  c10::Event ready(stream.device_type());
  ready.record(guard.getStream(stream.device()));
  ready.block(stream);
}

// `into` op= `other`, elementwise and in place.
void combineInto(
    at::Tensor& into,
    const at::Tensor& other,
    c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      into.add_(other);
      break;
    case c10d::ReduceOp::MAX:
      at::maximum_out(into, into, other);
      break;
    case c10d::ReduceOp::MIN:
      at::minimum_out(into, into, other);
      break;
    case c10d::ReduceOp::PRODUCT:
      into.mul_(other);
      break;
    default:
      TORCH_CHECK(false, "unexpected local reduce op ", op);
  }
}

} // namespace

struct Engine::Op {
  uint64_t seq;
  at::Tensor tensor; // the caller's
  at::Tensor flat; // 1-D and contiguous; aliases `tensor` unless copyBack
  bool copyBack;
  c10d::ReduceOp::RedOpType reduceOp;
  std::atomic<int64_t> partsLeft{0};
  std::atomic<bool> settled{false};
  c10::intrusive_ptr<c10::ivalue::Future> future;

  void finishPart() {
    if (--partsLeft != 0 || settled.exchange(true)) {
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
  at::Tensor input; // the slice of op->flat: reduce-scatter input, all-gather output
  std::optional<StagingRing::Lease> lease;
  at::Tensor localParts; // [L, slot]: every local rank's part of my slot
  at::Tensor slot; // this rank's slot of the slice; aliases input with one rank per machine
  at::Tensor shards; // [machines, shard]: every machine's contribution to my shard
  // Guarded by the engine's mutex_.
  int shardsReceived = 0;
  int reducedReceived = 0;
  int writesPending = 0;

  std::string describe() const {
    return "op #" + std::to_string(op->seq) + " slice " + std::to_string(index);
  }
  // Names everything both ends must agree on, so that ranks that issued
  // different all-reduces fail instead of reducing mismatched data.
  std::string tag(Rails::Lane lane) const {
    return std::to_string(static_cast<int>(lane)) + ":" +
        std::to_string(op->seq) + ":" + std::to_string(index) + ":" +
        c10::toString(input.scalar_type()) + ":" +
        std::to_string(static_cast<int>(op->reduceOp));
  }
};

Engine::Engine(
    const Topology& topology,
    const Config& config,
    c10::Device device,
    Groups groups,
    std::unique_ptr<Rails> rails)
    : topology_(topology),
      config_(config),
      device_(device),
      stream_(engineStreamFor(device)),
      groups_(std::move(groups)),
      granule_(
          static_cast<int64_t>(topology.localSize()) * topology.numMachines()),
      staging_(config.totalMemoryBytes, at::TensorOptions().device(device)),
      rails_(std::move(rails)),
      expected_(topology.numMachines()),
      reading_(topology.numMachines(), {false, false}) {
  TORCH_CHECK(topology_.numMachines() > 1, "fairring: engine needs 2+ machines");
  TORCH_CHECK(
      device_.is_cpu() || (device_.is_cuda() && device_.has_index()),
      "fairring: the engine runs on the CPU or one indexed CUDA device, not ",
      device_);
  TORCH_CHECK(
      (topology_.localSize() > 1) ==
          (groups_.reduceScatter && groups_.allGather),
      "fairring: local groups must exist exactly when machines have 2+ ranks");
  // One thread per stage, owned by the engine and joined by its destructor.
  threads_[0] = std::thread(
      [this] { runStage("reduce-scatter", &Engine::reduceScatterLoop); });
  threads_[1] = std::thread([this] { runStage("reduce", &Engine::reduceLoop); });
  threads_[2] = std::thread(
      [this] { runStage("all-gather", &Engine::allGatherLoop); });
}

Engine::~Engine() {
  abort("the process group was shut down");
  for (auto& thread : threads_) {
    thread.join();
  }
  // Closes the pipes and joins TensorPipe's loop: no callback runs after this.
  rails_.reset();
  if (stream_) {
    // Staging is freed next, possibly under queued copies and kernels.
    try {
      stream_->synchronize();
    } catch (const std::exception&) {
      // A failed device has nothing left to run; there is nothing to wait for.
    }
  }
}

void Engine::runStage(const char* stage, void (Engine::*loop)()) {
  try {
    std::optional<c10::StreamGuard> onEngineStream;
    if (stream_) {
      onEngineStream.emplace(*stream_);
    }
    (this->*loop)();
  } catch (const std::exception& error) {
    fail(std::string("the ") + stage + " stage failed: " + error.what());
  }
}

bool Engine::handles(const at::Tensor& tensor, c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::MAX:
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::PRODUCT:
      break;
    case c10d::ReduceOp::AVG:
      if (!at::isFloatingType(tensor.scalar_type())) {
        return false;
      }
      break;
    default:
      return false;
  }
  switch (tensor.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

c10::intrusive_ptr<c10::ivalue::Future> Engine::allreduce(
    const at::Tensor& tensor,
    c10d::ReduceOp::RedOpType reduceOp) {
  auto op = std::make_shared<Op>();
  op->tensor = tensor;
  op->copyBack = !tensor.is_contiguous();
  op->flat = tensor.contiguous().view({-1});
  op->reduceOp = reduceOp;
  // With CUDA devices, completion records events on the completing thread's
  // current streams: the engine stream, see finishPart's callers.
  op->future = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()),
      stream_ ? std::vector<c10::Device>{device_} : std::vector<c10::Device>{});

  const int64_t elementSize = op->flat.element_size();
  const int64_t bytes = op->flat.numel() * elementSize;
  // Shards below the transfer's floor go flat, with the tail.
  const int64_t minShardBytes =
      rails_->gpuDirect() ? cuda::kGpuDirectMinBytes : 1;
  // Below the threshold, latency rules and the flat all-reduce has fewer steps.
  const Plan plan = bytes < config_.flatThresholdBytes
      ? Plan{{}, 0, op->flat.numel()}
      : makePlan(
            op->flat.numel(),
            sliceNumelFor(
                sliceBytesFor(bytes, config_.sliceSizeBytes),
                elementSize,
                granule_),
            granule_,
            granule_ * ((minShardBytes + elementSize - 1) / elementSize));
  const bool hasTail = plan.tailNumel > 0;
  op->partsLeft = static_cast<int64_t>(plan.slices.size()) + (hasTail ? 1 : 0);
  if (op->partsLeft == 0) {
    op->seq = nextSeq_++;
    op->partsLeft = 1;
    op->finishPart();
    return op->future;
  }
  if (stream_) {
    // The input (made contiguous above, on the caller's stream) is ready for
    // the engine stream, and its memory not reused before the engine is done.
    orderAfterCurrentStream(*stream_);
    const c10::impl::VirtualGuardImpl guard(device_.type());
    guard.recordDataPtrOnStream(op->flat.storage().data_ptr(), *stream_);
    guard.recordDataPtrOnStream(op->tensor.storage().data_ptr(), *stream_);
  }

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
    for (size_t i = 0; i < plan.slices.size(); ++i) {
      auto slice = std::make_shared<SliceWork>();
      slice->op = op;
      slice->index = static_cast<int64_t>(i);
      slice->input =
          op->flat.narrow(0, plan.slices[i].offset, plan.slices[i].numel);
      toReduceScatter_.push_back(std::move(slice));
    }
  }
  progress_.notify_all();

  // The tail is too short to shard (or the tensor too small to bother): a
  // flat all-reduce, issued here so it keeps the issue order on the flat group.
  if (hasTail) {
    ++flatOps_;
    std::vector<at::Tensor> tail{
        op->flat.narrow(0, plan.tailOffset, plan.tailNumel)};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp(reduceOp);
    auto work = groups_.flat->allreduce(tail, options);
    // Runs on the flat group's thread (with CUDA, on a stream that waits for
    // the tail): only settles the op, on the engine stream as its slices do.
    work->getFuture()->addCallback(
        [op, stream = stream_](c10::ivalue::Future& done) {
          if (done.hasError()) {
            op->fail(done.exception_ptr());
            return;
          }
          if (!stream) {
            op->finishPart();
            return;
          }
          orderAfterCurrentStream(*stream);
          const c10::StreamGuard onEngineStream(*stream);
          op->finishPart();
        });
  }
  return op->future;
}

void Engine::attachStaging(
    SliceWork& slice,
    StagingRing::Lease lease,
    const StagingLayout& layout) {
  const int localSize = topology_.localSize();
  const int64_t slotNumel = slice.input.numel() / localSize;
  const int64_t slotBytes = slotNumel * slice.input.element_size();
  const auto dtype = slice.input.scalar_type();
  at::Tensor bytes = lease.bytes();
  if (localSize > 1) {
    // Every local rank's part of my slot; row 0 becomes the slot.
    slice.localParts = bytes.narrow(0, 0, localSize * slotBytes)
                           .view(dtype)
                           .view({localSize, slotNumel});
    slice.slot = slice.localParts[0];
  } else {
    slice.slot = slice.input;
  }
  slice.shards = bytes.narrow(0, layout.shardsOffset, slotBytes)
                     .view(dtype)
                     .view({topology_.numMachines(), -1});
  slice.lease.emplace(std::move(lease));
}

tensorpipe::Buffer Engine::bufferFor(const at::Tensor& tensor) const {
  if (stream_) {
    return cuda::tensorpipeBuffer(tensor.data_ptr(), *stream_);
  }
  return tensorpipe::CpuBuffer{tensor.data_ptr()};
}

at::Tensor Engine::shardOf(const SliceWork& slice, int machine) const {
  const int64_t shardNumel = slice.slot.numel() / topology_.numMachines();
  return slice.slot.narrow(0, machine * shardNumel, shardNumel);
}

// Step 1 and 2, for slices in issue order.
void Engine::reduceScatterLoop() {
  while (true) {
    auto slice =
        popWhenReady(toReduceScatter_, [](const SliceWork&) { return true; });
    if (!slice) {
      return;
    }
    const StagingLayout layout = stagingLayoutFor(
        slice->input.numel() * slice->input.element_size(),
        topology_.localSize(),
        topology_.numMachines());
    auto lease = staging_.acquire(layout.bytes, [this] { return failed(); });
    if (!lease) {
      return;
    }
    attachStaging(*slice, std::move(*lease), layout);
    expectMessages(slice);
    if (groups_.reduceScatter) {
      try {
        localReduceScatter(*slice);
      } catch (const std::exception& error) {
        fail(
            "local reduce-scatter of " + slice->describe() +
            " failed: " + error.what());
        return;
      }
    }
    const int me = topology_.machine();
    slice->shards[me].copy_(shardOf(*slice, me));
    for (int machine = 0; machine < topology_.numMachines(); ++machine) {
      if (machine != me) {
        send(slice, Rails::kShards, machine, shardOf(*slice, machine));
      }
    }
    push(toReduce_, slice);
  }
}

// Step 1 as an all-to-all of slots and one local reduction: Gloo's own
// reduce-scatter takes 2-3x as long as this on the same data.
void Engine::localReduceScatter(SliceWork& slice) {
  std::vector<int64_t> equalSplits;
  groups_.reduceScatter
      ->all_to_all_single(
          slice.localParts, slice.input, equalSplits, equalSplits)
      ->wait();
  const auto op = localOp(slice.op->reduceOp);
  for (int64_t part = 1; part < slice.localParts.size(0); ++part) {
    combineInto(slice.slot, slice.localParts[part], op);
  }
}

// Steps 3 and 4.
void Engine::reduceLoop() {
  const int peers = topology_.numMachines() - 1;
  while (true) {
    auto slice = popWhenReady(toReduce_, [peers](const SliceWork& s) {
      return s.shardsReceived == peers;
    });
    if (!slice) {
      return;
    }
    try {
      reduceShards(*slice);
    } catch (const std::exception& error) {
      fail("reducing " + slice->describe() + " failed: " + error.what());
      return;
    }
    const int me = topology_.machine();
    for (int machine = 0; machine < topology_.numMachines(); ++machine) {
      if (machine != me) {
        send(slice, Rails::kReduced, machine, shardOf(*slice, me));
      }
    }
    push(toAllGather_, slice);
  }
}

void Engine::reduceShards(SliceWork& slice) {
  at::Tensor out = shardOf(slice, topology_.machine());
  switch (slice.op->reduceOp) {
    case c10d::ReduceOp::SUM:
      at::sum_out(out, slice.shards, 0);
      break;
    case c10d::ReduceOp::AVG:
      at::sum_out(out, slice.shards, 0);
      out.div_(topology_.worldSize());
      break;
    case c10d::ReduceOp::MAX:
      at::amax_out(out, slice.shards, 0);
      break;
    case c10d::ReduceOp::MIN:
      at::amin_out(out, slice.shards, 0);
      break;
    case c10d::ReduceOp::PRODUCT:
      at::prod_out(out, slice.shards, 0);
      break;
    default:
      TORCH_CHECK(false, "unexpected reduce op ", slice.op->reduceOp);
  }
}

// Step 5, then the slice's staging is free and its part of the op done.
void Engine::allGatherLoop() {
  const int peers = topology_.numMachines() - 1;
  while (true) {
    auto slice = popWhenReady(toAllGather_, [peers](const SliceWork& s) {
      return s.reducedReceived == peers && s.writesPending == 0;
    });
    if (!slice) {
      return;
    }
    if (groups_.allGather) {
      try {
        groups_.allGather->all_gather_single(slice->input, slice->slot)->wait();
      } catch (const std::exception& error) {
        fail(
            "local all-gather of " + slice->describe() +
            " failed: " + error.what());
        return;
      }
    }
    slice->lease.reset();
    ++slicesDone_;
    slice->op->finishPart();
  }
}

std::shared_ptr<Engine::SliceWork> Engine::popWhenReady(
    std::deque<std::shared_ptr<SliceWork>>& queue,
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

void Engine::push(
    std::deque<std::shared_ptr<SliceWork>>& queue,
    std::shared_ptr<SliceWork> slice) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue.push_back(std::move(slice));
  }
  progress_.notify_all();
}

void Engine::expectMessages(const std::shared_ptr<SliceWork>& slice) {
  std::vector<std::pair<int, Rails::Lane>> idle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int machine = 0; machine < topology_.numMachines(); ++machine) {
      if (machine == topology_.machine()) {
        continue;
      }
      for (auto lane : {Rails::kShards, Rails::kReduced}) {
        expected_[machine][lane].push_back(slice);
        if (!reading_[machine][lane]) {
          reading_[machine][lane] = true;
          idle.emplace_back(machine, lane);
        }
      }
    }
  }
  // TensorPipe may run callbacks inline, so never call it under mutex_.
  for (auto [machine, lane] : idle) {
    readNext(machine, lane);
  }
}

// Posts the read for the first slice expecting a message from `machine` on
// `lane`; its completion posts the next. Callbacks run on TensorPipe's loop.
void Engine::readNext(int machine, Rails::Lane lane) {
  std::shared_ptr<SliceWork> slice;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& queue = expected_[machine][lane];
    if (!error_.empty() || queue.empty()) {
      reading_[machine][lane] = false;
      return;
    }
    slice = queue.front();
  }
  at::Tensor target = lane == Rails::kShards ? slice->shards[machine]
                                             : shardOf(*slice, machine);
  const int peer = rails_->peerRank(machine);
  auto where = [slice, lane, peer] {
    return std::string(laneName(lane)) + " of " + slice->describe() +
        " from rail peer rank " + std::to_string(peer);
  };
  tensorpipe::Pipe& pipe = rails_->pipe(machine, lane);
  pipe.readDescriptor([this, &pipe, slice, machine, lane, target, where](
                          const tensorpipe::Error& error,
                          tensorpipe::Descriptor descriptor) {
    if (error) {
      fail("receiving " + where() + " failed: " + error.what());
      return;
    }
    const size_t bytes = target.numel() * target.element_size();
    if (descriptor.metadata != slice->tag(lane) ||
        descriptor.tensors.size() != 1 ||
        descriptor.tensors[0].length != bytes) {
      fail(
          "receiving " + where() + ": got message '" + descriptor.metadata +
          "' instead; the ranks issued different all-reduces (sizes, dtypes "
          "or order differ)");
      return;
    }
    tensorpipe::Allocation allocation;
    allocation.tensors.push_back({bufferFor(target)});
    pipe.read(
        std::move(allocation),
        [this, slice, machine, lane, bytes, where](
            const tensorpipe::Error& error) {
          if (error) {
            fail("receiving " + where() + " failed: " + error.what());
            return;
          }
          railBytesReceived_ += static_cast<int64_t>(bytes);
          {
            std::lock_guard<std::mutex> lock(mutex_);
            expected_[machine][lane].pop_front();
            ++(lane == Rails::kShards ? slice->shardsReceived
                                      : slice->reducedReceived);
          }
          progress_.notify_all();
          readNext(machine, lane);
        });
  });
}

void Engine::send(
    const std::shared_ptr<SliceWork>& slice,
    Rails::Lane lane,
    int machine,
    const at::Tensor& shard) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++slice->writesPending;
  }
  const size_t bytes = shard.numel() * shard.element_size();
  tensorpipe::Message message;
  message.metadata = slice->tag(lane);
  // Naming the target device lets TensorPipe send the data at once instead of
  // waiting for the reader to allocate: one round trip less per shard.
  message.tensors.push_back(
      {bufferFor(shard), bytes, rails_->peerDevice(machine), ""});
  const int peer = rails_->peerRank(machine);
  // Runs on TensorPipe's loop once the data is handed to the transport.
  rails_->pipe(machine, lane).write(
      std::move(message),
      [this, slice, lane, peer, bytes](const tensorpipe::Error& error) {
        if (error) {
          fail(
              std::string("sending ") + laneName(lane) + " of " +
              slice->describe() + " to rail peer rank " +
              std::to_string(peer) + " failed: " + error.what());
          return;
        }
        railBytesSent_ += static_cast<int64_t>(bytes);
        {
          std::lock_guard<std::mutex> lock(mutex_);
          --slice->writesPending;
        }
        progress_.notify_all();
      });
}

void Engine::abort(const std::string& reason) {
  fail(reason);
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
  rails_->closePipes();
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
      flatOps_.load(),
      railBytesSent_.load(),
      railBytesReceived_.load()};
}

} // namespace fairring
