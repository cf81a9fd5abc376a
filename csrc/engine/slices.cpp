#include <torch_headers.h> // first: the precompiled torch headers

// One slice's life, on the engine's three stage threads, in step order:
// each thread's loop, then start, steps 1 and 2 (reduce-scatter), 3 and 4
// (reduce), 5 (all-gather), then what the steps share: their device work
// and the stage queues. (engine.cpp makes ops into slices and keeps the
// launch order; slice_memory.cpp places a slice's elements,
// slice_rails.cpp its messages.)

#include "engine/engine.h"

#include "engine/ops.h"
#include "reduction.h"

namespace fairring {

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
    if (launchesAhead_) {
      // The all-gather stage launches the reduce too (Engine::allGatherLoop).
      {
        std::lock_guard<std::mutex> lock(mutex_);
        slice->step = railsStepLocked(*slice);
      }
      push(toAllGather_, slice);
      continue;
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
// Where the engine launches ahead it waits for none of these but the turn,
// and launches steps 3 and 4 first: the reduce then takes its place in the
// launch order, right before the all-gather (docs/design.md, "The host
// never waits").
void Engine::allGatherLoop() {
  const int peers = topology_.numMachines() - 1;
  while (auto slice =
             popWhenReady(toAllGather_, [this, peers](const SliceWork& s) {
               return (launchesAhead_ ||
                       (s.reducedReceived == peers && s.writesPending == 0)) &&
                   launchOrder_.isNext(
                       LaunchOrder::Step::kAllGather, s.op->seq, s.index);
             })) {
    if (launchesAhead_ &&
        !traced(Stage::kReduce, *slice, [&] { return reduce(slice); })) {
      return;
    }
    if (!launchesAhead_) {
      slice->step = SliceStep::kLocalAllGather;
    }
    if (!traced(Stage::kAllGather, *slice, [&] { return allGather(slice); })) {
      return;
    }
    const bool last =
        slice->index + 1 == static_cast<int64_t>(slice->op->slices.size());
    if (!launchesAhead_) {
      slice->step = SliceStep::kDone;
      // Completion is device work too: it follows the slice's all-gather.
      enqueueFinish(slice);
      continue;
    }
    if (last) {
      const std::shared_ptr<Op>& op = slice->op;
      if (op->copyBack) {
        // Before the end a caller's stream waits for, not with the op's
        // completion, which follows the rails.
        device_->enqueue(
            queueOf(Stage::kAllGather),
            deviceWork(slice, Stage::kAllGather, [op] {
              op->tensor.copy_(op->elements.view(op->tensor.sizes()));
            }));
        op->copyBack = false; // read by finishSlice after the last gate
      }
      // Every launch of the op is made: a caller's stream may wait for it.
      op->launchEnd->launched(device_->record(queueOf(Stage::kAllGather)));
    }
    passFinishGate(slice, /*onOutputStage=*/true);
  }
}

void Engine::enqueueFinish(const std::shared_ptr<SliceWork>& slice) {
  device_->enqueue(queueOf(Stage::kAllGather), [this, op = slice->op] {
    // After a failure the device's work so far may have run on what the
    // memory held (a device that takes nothing back runs it out): the op
    // fails with the engine instead.
    if (failed()) {
      return;
    }
    op->finishSlice();
    if (op->settled) {
      std::lock_guard<std::mutex> lock(mutex_);
      // Ops finish in issue order: the finished one is first.
      while (!liveOps_.empty() && liveOps_.front()->settled) {
        liveOps_.pop_front();
      }
    }
  });
}

void Engine::passFinishGate(
    const std::shared_ptr<SliceWork>& slice, bool onOutputStage) {
  if (--slice->finishGates != 0) {
    return;
  }
  if (onOutputStage) {
    enqueueFinish(slice);
    return;
  }
  follower_->post(DeviceFollower::kFinishes, Fence(), [this, slice] {
    enqueueFinish(slice);
  });
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
  uint64_t previousTicket = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    previousUse = lastReleased_;
    previousTicket = lastReleasedTicket_;
    if (launchesAhead_) {
      slice->ticket = ++lastTicket_;
    }
  }
  if (launchesAhead_) {
    // The memory's last users finish on the device before anything writes
    // it there; the rails' copy is written by the receives posted once they
    // are done with it (the follower), and by copies that wait for the last
    // users' sends (Engine::reduceScatter).
    device_->waitOnDevice(queueOf(Stage::kReduceScatter), previousUse);
    attachStaging(*slice, std::move(*lease), layout);
    slice->previousTicket = previousTicket;
    const int peers = topology_.numMachines() - 1;
    const Collective kind = slice->op->kind;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slice->sendsLeft = (kind == Collective::kAllGather ? 0 : peers) +
          (kind == Collective::kReduceScatter ? 0 : peers);
      slice->sendsUnwritten = slice->sendsLeft;
      // A lane the collective does not use counts as arrived.
      if (kind == Collective::kAllGather) {
        signalLocked(Signal::kShardsArrived, slice->ticket);
      }
      if (kind == Collective::kReduceScatter) {
        signalLocked(Signal::kReducedArrived, slice->ticket);
      }
    }
    follower_->post(
        DeviceFollower::kReceives,
        previousUse,
        [this, slice] { expectMessages(slice); },
        [this, previousTicket] {
          std::lock_guard<std::mutex> lock(mutex_);
          return signalled_[static_cast<int>(Signal::kSendsDone)].reached(
              previousTicket);
        });
    return true;
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
  if (launchesAhead_) {
    // Into the rails' copy, once the rails are done with what its last
    // users sent from there.
    if (slice->previousTicket != 0) {
      device_->waitForSignal(
          queueOf(Stage::kReduceScatter),
          Signal::kSendsDone,
          static_cast<uint32_t>(slice->previousTicket));
    }
    if (kind != Collective::kAllGather) {
      for (const int machine : sendOrder_) {
        device_->railsCopy(
            queueOf(Stage::kReduceScatter),
            railsShardOf(*slice, machine),
            shardOf(*slice, machine),
            /*received=*/false);
      }
    }
  }
  slice->reduceScattered = device_->record(queueOf(Stage::kReduceScatter));
  launched(LaunchOrder::Step::kReduceScatter);
  if (kind == Collective::kAllGather) {
    return true; // its chunk goes out from the reduce stage, as a result
  }
  if (launchesAhead_) {
    follower_->post(
        DeviceFollower::kShardSends, slice->reduceScattered, [this, slice] {
          for (const int machine : sendOrder_) {
            send(slice, rails::kShards, machine, railsShardOf(*slice, machine));
          }
        });
    return true;
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
  const fairring::Queue queue = queueOf(Stage::kReduce);
  device_->waitOnDevice(queue, slice->reduceScattered);
  if (kind != Collective::kAllGather) {
    if (launchesAhead_) {
      device_->waitForSignal(
          queue, Signal::kShardsArrived, static_cast<uint32_t>(slice->ticket));
      for (const int machine : sendOrder_) {
        device_->railsCopy(
            queue,
            slice->shards[machine],
            slice->railsShards[machine],
            /*received=*/true);
      }
    } else {
      device_->waitOnDevice(queue, slice->shardsArrived);
    }
    device_->enqueue(
        queue, deviceWork(slice, Stage::kReduce, [this, slice, me] {
          at::Tensor out = shardOf(*slice, me);
          reduceRows(
              out, slice->shards, slice->op->reduceOp, topology_.worldSize());
        }));
  }
  if (launchesAhead_ && kind != Collective::kReduceScatter) {
    device_->railsCopy(
        queue, railsShardOf(*slice, me), shardOf(*slice, me), false);
  }
  slice->reduced = device_->record(queue);
  if (kind == Collective::kReduceScatter) {
    return true;
  }
  auto sendReduced = [this, slice, me] {
    const at::Tensor reduced =
        launchesAhead_ ? railsShardOf(*slice, me) : shardOf(*slice, me);
    for (const int machine : sendOrder_) {
      send(slice, rails::kReduced, machine, reduced);
    }
  };
  if (launchesAhead_) {
    follower_->post(
        DeviceFollower::kReducedSends, slice->reduced, std::move(sendReduced));
    return true;
  }
  if (!device_->waitOnHost(slice->reduced, [this] { return failed(); })) {
    return false;
  }
  sendReduced();
  return true;
}

// Step 5; then the staging goes back. A reduce-scatter copies its shard out
// instead.
bool Engine::allGather(const std::shared_ptr<SliceWork>& slice) {
  const fairring::Queue queue = queueOf(Stage::kAllGather);
  device_->waitOnDevice(queue, slice->reduced);
  if (!launchesAhead_) {
    device_->waitOnDevice(queue, slice->reducedArrived);
  } else if (slice->op->kind != Collective::kReduceScatter) {
    device_->waitForSignal(
        queue, Signal::kReducedArrived, static_cast<uint32_t>(slice->ticket));
    for (const int machine : sendOrder_) {
      device_->railsCopy(
          queue,
          shardOf(*slice, machine),
          railsShardOf(*slice, machine),
          /*received=*/true);
    }
  }
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
    lastReleasedTicket_ = slice->ticket;
  }
  // Back before the turn passes, as the window counts on, unless the rails
  // keep a send for a resend: then once the peer has it (Engine::send), and
  // the reduce-scatter that needs these bytes waits for the acknowledgement,
  // which needs no launch (docs/design.md, "Rails that fail over"). Exactly
  // one of this and the last release decides, under mutex_.
  // Launching ahead, the lease goes back now: the rails' copy is reused
  // only once the device waited for their signals (Engine::start).
  bool release = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slice->gathered = true;
    release = launchesAhead_ || slice->sendsKept == 0 || !lanes_->resends();
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
