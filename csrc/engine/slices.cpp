#include <torch_headers.h> // first: the precompiled torch headers

// One slice's life, on the engine's three stage threads, in step order:
// each thread's loop, then start, steps 1 and 2 (reduce-scatter), 3 and 4
// (reduce), 5 (all-gather), then what the steps share: their device work,
// the shards in staging, and the rails' messages expected and sent.
// (engine.cpp makes ops into slices and keeps the launch order.)

#include "engine/engine.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include <c10/util/Exception.h>

#include "engine/ops.h"
#include "reduction.h"

namespace fairring {

at::Tensor Engine::stagedRows(const SliceWork& slice) const {
  return slice.padded.view({slice.rows, slice.plan.paddedNumel})
      .narrow(1, 0, slice.plan.numel);
}

at::Tensor Engine::chunkColumns(
    const SliceWork& slice, const at::Tensor& flat) const {
  return flat.view({slice.rows, slice.op->chunkNumel})
      .narrow(1, slice.plan.offset, slice.plan.numel);
}

void Engine::moveRows(
    const SliceWork& slice, const at::Tensor& columns, bool toStaging) const {
  at::Tensor staged = stagedRows(slice);
  const bool rowsContiguous = staged.stride(1) == 1 && columns.stride(1) == 1;
  if (!columns.is_cpu() || !rowsContiguous ||
      staged.scalar_type() != columns.scalar_type()) {
    if (toStaging) {
      staged.copy_(columns.index_select(0, rowRanks_));
    } else {
      columns.index_copy_(0, rowRanks_, staged);
    }
    return;
  }
  // Raw copies: the shapes the offsets come from are checked first.
  TORCH_CHECK(
      staged.size(0) == static_cast<int64_t>(rowRankList_.size()) &&
          columns.size(0) == staged.size(0) &&
          columns.size(1) == staged.size(1),
      "fairring: moving ",
      staged.size(0),
      " staged rows of ",
      staged.size(1),
      " elements for ",
      rowRankList_.size(),
      " ranks into ",
      columns.sizes(),
      "; a fairring bug: please report it");
  const int64_t rowBytes = staged.size(1) * staged.element_size();
  auto* stagedBase = static_cast<std::byte*>(staged.data_ptr());
  auto* columnsBase = static_cast<std::byte*>(columns.data_ptr());
  const int64_t stagedStride = staged.stride(0) * staged.element_size();
  const int64_t columnsStride = columns.stride(0) * columns.element_size();
  for (size_t row = 0; row < rowRankList_.size(); ++row) {
    std::byte* stagedRow =
        stagedBase + static_cast<int64_t>(row) * stagedStride;
    std::byte* columnsRow = columnsBase + rowRankList_[row] * columnsStride;
    if (toStaging) {
      std::memcpy(stagedRow, columnsRow, rowBytes);
    } else {
      std::memcpy(columnsRow, stagedRow, rowBytes);
    }
  }
}

bool Engine::gatherIntoRows(const SliceWork& slice) const {
  const at::Tensor columns = chunkColumns(slice, slice.op->tensor);
  if (!localSteps_->placesParts() || !columns.is_cpu() ||
      columns.stride(1) != 1 ||
      columns.scalar_type() != slice.slot.scalar_type()) {
    return false;
  }
  const int machines = topology_.numMachines();
  // Raw copies: the shapes the offsets come from are checked first.
  TORCH_CHECK(
      slice.slot.numel() == machines * slice.plan.paddedNumel &&
          columns.size(0) == static_cast<int64_t>(rowRankList_.size()) &&
          columns.size(1) == slice.plan.numel,
      "fairring: placing a slot of ",
      slice.slot.numel(),
      " elements (",
      machines,
      " shards of ",
      slice.plan.paddedNumel,
      ") into ",
      columns.sizes(),
      "; a fairring bug: please report it");
  const int64_t elementSize = columns.element_size();
  const int64_t shardBytes = slice.plan.paddedNumel * elementSize;
  const int64_t keptBytes = slice.plan.numel * elementSize; // no padding
  const int64_t rowBytes = columns.stride(0) * elementSize;
  auto* base = static_cast<std::byte*>(columns.data_ptr());
  localSteps_->allGatherPlaced(
      slice.slot,
      [&](int rank, int64_t offset, const std::byte* data, int64_t length) {
        // Part `rank` is its machines' shards end to end: row rank x M + m.
        for (int64_t m = offset / shardBytes;
             m < machines && m * shardBytes < offset + length;
             ++m) {
          const int64_t from = std::max(offset, m * shardBytes);
          const int64_t to =
              std::min(offset + length, m * shardBytes + keptBytes);
          if (from < to) {
            std::byte* row =
                base + rowRankList_[rank * machines + m] * rowBytes;
            std::memcpy(
                row + (from - m * shardBytes),
                data + (from - offset),
                to - from);
          }
        }
      },
      slice.localStepKey(),
      slice.op->deadline);
  return true;
}

// The reduce-scatter thread: start, steps 1 and 2, in issue order, each
// slice's step 1 in its turn.
void Engine::reduceScatterLoop() {
  while (auto slice =
             popWhenReady(toReduceScatter_, [this](const SliceWork& s) {
               return launchOrder_.isNext(
                   LaunchOrder::Step::kReduceScatter, s.op->seq, s.index);
             })) {
    slice->step = SliceStep::kStaging;
    if (!traced(Stage::kReduceScatter, *slice, [&] {
          return start(slice) && reduceScatter(slice);
        })) {
      return;
    }
    slice->step = SliceStep::kAwaitShards;
    push(toReduce_, slice);
  }
}

// The reduce thread: steps 3 and 4, once every machine's shard is here.
void Engine::reduceLoop() {
  const int peers = topology_.numMachines() - 1;
  while (auto slice = popWhenReady(toReduce_, [peers](const SliceWork& s) {
           return s.shardsReceived == peers;
         })) {
    slice->step = SliceStep::kReducing;
    if (!traced(Stage::kReduce, *slice, [&] { return reduce(slice); })) {
      return;
    }
    slice->step = SliceStep::kAwaitReduced;
    push(toAllGather_, slice);
  }
}

// The all-gather thread: step 5, once every reduced shard is here, the
// rails are done reading this slice's staging and it is the slice's turn.
void Engine::allGatherLoop() {
  const int peers = topology_.numMachines() - 1;
  while (auto slice =
             popWhenReady(toAllGather_, [this, peers](const SliceWork& s) {
               return s.reducedReceived == peers && s.writesPending == 0 &&
                   launchOrder_.isNext(
                       LaunchOrder::Step::kAllGather, s.op->seq, s.index);
             })) {
    slice->step = SliceStep::kLocalAllGather;
    if (!traced(Stage::kAllGather, *slice, [&] { return allGather(slice); })) {
      return;
    }
    slice->step = SliceStep::kDone;
    // Completion is device work too: it follows the slice's all-gather.
    device_->enqueue(queueOf(Stage::kAllGather), [this, op = slice->op] {
      op->finishSlice();
      if (op->settled) {
        std::lock_guard<std::mutex> lock(mutex_);
        // Ops finish in issue order: the finished one is first.
        while (!liveOps_.empty() && liveOps_.front()->settled) {
          liveOps_.pop_front();
        }
      }
    });
    // After the op's last device work (every stage takes slices in queue
    // order, so its last slice comes last): its callers' streams go on.
    if (slice->index + 1 == static_cast<int64_t>(slice->op->slices.size())) {
      deviceWork(slice, Stage::kAllGather, [this, seq = slice->op->seq] {
        device_->releaseCaller(queueOf(Stage::kAllGather), callerTicket(seq));
      })();
    }
  }
}

// Staging for the slice, and the messages it will receive on both lanes.
bool Engine::start(const std::shared_ptr<SliceWork>& slice) {
  const auto cancelled = [this] { return failed(); };
  const auto layout =
      leaseLayout(slice->plan, slice->rows, slice->op->elements.element_size());
  // Under the launch order, an op's window (launchWindow) replays its leases
  // from an empty ring; leases kept for resends may outlive the previous
  // op's last all-gather, so its first slice waits until they are back.
  const auto placement = launchOrder_.enforced() && slice->index == 0
      ? StagingRing::Placement::kEmptyRing
      : StagingRing::Placement::kAnywhere;
  auto lease = staging_.acquire(layout.bytes, cancelled, placement);
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
    SliceWork& slice, StagingRing::Lease lease, const StagingLayout& layout) {
  const int localSize = topology_.localSize();
  const auto dtype = slice.op->elements.scalar_type();
  const int64_t elementSize = slice.op->elements.element_size();
  const int64_t paddedNumel = slice.stagedNumel();
  const int64_t slotNumel = paddedNumel / localSize;
  at::Tensor bytes = lease.bytes();
  auto view = [&](int64_t offset, int64_t numel) {
    return bytes.narrow(0, offset, numel * elementSize).view(dtype);
  };
  slice.parts = view(0, localSize * slotNumel).view({localSize, slotNumel});
  slice.slot = slice.parts[0];
  slice.shards =
      view(layout.shardsOffset, slotNumel).view({topology_.numMachines(), -1});
  if (slice.staged()) {
    slice.padded = view(layout.paddedOffset, paddedNumel);
  }
  slice.lease.emplace(std::move(lease));
}

// Steps 1 and 2. An all-gather has neither: its own chunk becomes its
// slot's shard, as if reduced.
bool Engine::reduceScatter(const std::shared_ptr<SliceWork>& slice) {
  const Collective kind = slice->op->kind;
  slice->step = SliceStep::kLocalReduceScatter;
  if (slice->index == 0) {
    device_->waitOnDevice(
        queueOf(Stage::kReduceScatter), slice->op->inputReady);
  }
  device_->enqueue(
      queueOf(Stage::kReduceScatter),
      deviceWork(slice, Stage::kReduceScatter, [this, slice, kind] {
        const int me = topology_.machine();
        if (kind == Collective::kAllGather) {
          at::Tensor mine = shardOf(*slice, me);
          const int64_t numel = slice->plan.numel;
          mine.narrow(0, 0, numel)
              .copy_(slice->op->elements.narrow(0, slice->plan.offset, numel));
          mine.narrow(0, numel, mine.numel() - numel).zero_();
          return;
        }
        if (kind == Collective::kReduceScatter) {
          // Row l x M + m: the chunk of the rank with local index l on
          // machine m, so that local rank l's part is its rail's chunks.
          const Slice& plan = slice->plan;
          if (plan.padded()) {
            slice->padded.view({slice->rows, plan.paddedNumel})
                .narrow(1, plan.numel, plan.paddedNumel - plan.numel)
                .zero_();
          }
          moveRows(
              *slice,
              chunkColumns(*slice, slice->op->elements),
              /*toStaging=*/true);
        } else if (slice->padded.defined()) {
          const int64_t numel = slice->plan.numel;
          slice->padded.narrow(0, 0, numel).copy_(slice->input);
          slice->padded.narrow(0, numel, slice->plan.paddedNumel - numel)
              .zero_();
        }
        at::Tensor input = slice->io();
        localSteps_->reduceScatter(
            slice->slot,
            slice->parts,
            input,
            localReduceOp(slice->op->reduceOp),
            slice->localStepKey(),
            slice->op->deadline);
        slice->shards[me].copy_(shardOf(*slice, me));
      }));
  slice->reduceScattered = device_->record(queueOf(Stage::kReduceScatter));
  launched(LaunchOrder::Step::kReduceScatter);
  if (kind == Collective::kAllGather) {
    return true; // its chunk goes out from the reduce stage, as a result
  }
  // The rails read the slot from the host's side: it must be ready.
  if (!device_->waitOnHost(
          slice->reduceScattered, [this] { return failed(); })) {
    return false;
  }
  for (const int machine : sendOrder_) {
    send(slice, rails::kShards, machine, shardOf(*slice, machine));
  }
  return true;
}

// Steps 3 and 4. A reduce-scatter's result is this rank's shard: it sends
// none back. An all-gather reduces nothing: it sends its own chunk.
bool Engine::reduce(const std::shared_ptr<SliceWork>& slice) {
  const int me = topology_.machine();
  const Collective kind = slice->op->kind;
  device_->waitOnDevice(queueOf(Stage::kReduce), slice->reduceScattered);
  if (kind != Collective::kAllGather) {
    device_->waitOnDevice(queueOf(Stage::kReduce), slice->shardsArrived);
    device_->enqueue(
        queueOf(Stage::kReduce),
        deviceWork(slice, Stage::kReduce, [this, slice, me] {
          at::Tensor out = shardOf(*slice, me);
          reduceRows(
              out, slice->shards, slice->op->reduceOp, topology_.worldSize());
        }));
  }
  slice->reduced = device_->record(queueOf(Stage::kReduce));
  if (kind == Collective::kReduceScatter) {
    return true;
  }
  if (!device_->waitOnHost(slice->reduced, [this] { return failed(); })) {
    return false;
  }
  for (const int machine : sendOrder_) {
    send(slice, rails::kReduced, machine, shardOf(*slice, me));
  }
  return true;
}

// Step 5; then the staging goes back. A reduce-scatter copies its shard out
// instead.
bool Engine::allGather(const std::shared_ptr<SliceWork>& slice) {
  device_->waitOnDevice(queueOf(Stage::kAllGather), slice->reduced);
  device_->waitOnDevice(queueOf(Stage::kAllGather), slice->reducedArrived);
  device_->enqueue(
      queueOf(Stage::kAllGather),
      deviceWork(slice, Stage::kAllGather, [this, slice] {
        const SliceWork& s = *slice;
        switch (s.op->kind) {
          case Collective::kReduceScatter:
            s.op->tensor.view({-1})
                .narrow(0, s.plan.offset, s.plan.numel)
                .copy_(
                    shardOf(s, topology_.machine()).narrow(0, 0, s.plan.numel));
            return;
          case Collective::kAllGather: {
            if (gatherIntoRows(s)) {
              return;
            }
            at::Tensor gathered = s.padded;
            localSteps_->allGather(
                gathered, s.slot, s.localStepKey(), s.op->deadline);
            moveRows(s, chunkColumns(s, s.op->tensor), /*toStaging=*/false);
            return;
          }
          case Collective::kAllReduce: {
            at::Tensor output = s.io();
            localSteps_->allGather(
                output, s.slot, s.localStepKey(), s.op->deadline);
            if (s.padded.defined()) {
              s.input.copy_(s.padded.narrow(0, 0, s.plan.numel));
            }
            return;
          }
        }
      }));
  if (failed()) {
    return false; // the CPU runs work at once: it failed there
  }
  const Fence done = device_->record(queueOf(Stage::kAllGather));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lastReleased_ = done; // before the lease: whoever gets it sees this
  }
  // Back before the turn passes, as the window counts on, unless the rails
  // keep a send for a resend: then once the peer has it (Engine::send), and
  // the reduce-scatter that needs these bytes waits for the acknowledgement,
  // which needs no launch (docs/design.md, "Rails that fail over"). Exactly
  // one of this and the last release decides, under mutex_.
  bool release = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slice->gathered = true;
    release = slice->sendsKept == 0 || !lanes_->resends();
  }
  if (release) {
    slice->lease.reset();
  }
  launched(LaunchOrder::Step::kAllGather);
  ++slicesDone_;
  return true;
}

std::function<void()> Engine::deviceWork(
    const std::shared_ptr<SliceWork>& slice,
    Stage stage,
    std::function<void()> work) {
  // Runs where the stage's device work runs (the stage thread, or an
  // emulated stream's worker): an error stops the engine, naming the step.
  return [this, slice, stage, work = std::move(work)] {
    try {
      work();
    } catch (const std::exception& error) {
      const std::string me = who(topology_.rank());
      std::string what;
      switch (stage) {
        case Stage::kReduceScatter:
          what = me + "'s local reduce-scatter of " + slice->describe() +
              " failed: " + error.what();
          break;
        case Stage::kReduce:
          what = me + " failed reducing " + slice->describe() + ": " +
              error.what();
          break;
        case Stage::kAllGather:
          what = me + "'s local all-gather of " + slice->describe() +
              " failed: " + error.what();
          break;
      }
      Cause cause = Cause::secondHand(what);
      cause.kind = FailureKind::kLocal;
      stop(std::move(cause));
    }
  };
}

template <typename Step>
bool Engine::traced(Stage stage, const SliceWork& slice, Step&& step) {
  const StageSpan span(
      timeline_.get(),
      slice.op->profiler,
      stage,
      slice.op->seq,
      slice.index,
      slice.numel() * slice.op->elements.element_size());
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
  auto arrival = [this, slice](
                     int machine, rails::Lane lane, rails::Buffer buffer) {
    return [this, slice, machine, lane, buffer] {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        Fence fence = device_->receivedFence(buffer);
        if (lane == rails::kShards) {
          ++slice->shardsReceived;
          slice->shardFrom[machine] = 1;
          slice->shardsArrived = std::move(fence);
        } else {
          ++slice->reducedReceived;
          slice->reducedFrom[machine] = 1;
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
    // An all-gather sends no shards, a reduce-scatter none reduced.
    if (slice->op->kind != Collective::kAllGather) {
      const rails::Buffer shards =
          device_->receiveBuffer(slice->shards[machine]);
      lanes_->expect(
          machine,
          rails::kShards,
          {slice->tag(rails::kShards),
           shards,
           laneContent(*slice, rails::kShards),
           arrival(machine, rails::kShards, shards)});
    }
    if (slice->op->kind != Collective::kReduceScatter) {
      const rails::Buffer reduced =
          device_->receiveBuffer(shardOf(*slice, machine));
      lanes_->expect(
          machine,
          rails::kReduced,
          {slice->tag(rails::kReduced),
           reduced,
           laneContent(*slice, rails::kReduced),
           arrival(machine, rails::kReduced, reduced)});
    }
  }
}

std::string Engine::laneContent(const SliceWork& slice, rails::Lane lane) {
  const char* what = lane == rails::kShards      ? "shards of "
      : slice.op->kind == Collective::kAllGather ? "chunks of "
                                                 : "reduced shards of ";
  return what + slice.describe();
}

void Engine::send(
    const std::shared_ptr<SliceWork>& slice,
    rails::Lane lane,
    int machine,
    const at::Tensor& shard) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++slice->writesPending;
    ++slice->sendsTo[machine];
    ++slice->sendsKept;
  }
  lanes_->send(
      machine,
      lane,
      slice->tag(lane),
      device_->sendBuffer(shard),
      laneContent(*slice, lane),
      // On the transport's thread, once the rails are done with the memory.
      [this, slice, machine] {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          --slice->writesPending;
          --slice->sendsTo[machine];
        }
        progress_.notify_all();
      },
      // Once the peer has it: it is never sent again.
      [this, slice] {
        bool release = false;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          release =
              --slice->sendsKept == 0 && slice->gathered && lanes_->resends();
        }
        if (release) {
          slice->lease.reset();
        }
      });
}

std::shared_ptr<Engine::SliceWork> Engine::popWhenReady(
    Queue& queue, const std::function<bool(const SliceWork&)>& ready) {
  std::unique_lock<std::mutex> lock(mutex_);
  progress_.wait(lock, [&] {
    return failed() || (!queue.empty() && ready(*queue.front()));
  });
  if (failed()) {
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
} // namespace fairring
