#include <torch_headers.h> // first: the precompiled torch headers

// What a slice's steps share on the rails: the messages it expects and
// sends, and, where the engine launches ahead, the signals the host raises
// for the device as they arrive and leave. (slices.cpp runs the steps.)

#include "engine/engine.h"
#include "engine/ops.h"

namespace fairring {

rails::Buffer Engine::railsBuffer(const at::Tensor& shard, bool send) const {
  if (launchesAhead_) {
    return hostBuffer(shard);
  }
  return send ? device_->sendBuffer(shard) : device_->receiveBuffer(shard);
}

void Engine::signalLocked(Signal signal, uint64_t ticket) {
  TicketPrefix& prefix = signalled_[static_cast<int>(signal)];
  const uint64_t before = prefix.prefix();
  const uint64_t after = prefix.complete(ticket);
  if (after != before) {
    device_->raiseSignal(signal, static_cast<uint32_t>(after));
  }
}

SliceStep Engine::railsStepLocked(const SliceWork& slice) const {
  const int peers = topology_.numMachines() - 1;
  if (slice.shardsReceived < peers) {
    return SliceStep::kAwaitShards;
  }
  if (slice.reducedReceived < peers) {
    return SliceStep::kAwaitReduced;
  }
  return SliceStep::kLocalAllGather;
}

void Engine::expectMessages(const std::shared_ptr<SliceWork>& slice) {
  // Run on the transport's thread(s): count, note the fence, wake the
  // stages. The fence is recorded under the lock, so the one kept last was
  // recorded last: after every copy whose receive completed before it.
  auto arrival = [this, slice](
                     int machine, rails::Lane lane, rails::Buffer buffer) {
    return [this, slice, machine, lane, buffer] {
      const int peers = topology_.numMachines() - 1;
      bool allArrived = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        // Launching ahead, the device waits for the signal, not a fence.
        Fence fence = launchesAhead_ ? Fence() : device_->receivedFence(buffer);
        if (lane == rails::kShards) {
          ++slice->shardsReceived;
          slice->shardFrom[machine] = 1;
          slice->shardsArrived = std::move(fence);
        } else {
          ++slice->reducedReceived;
          slice->reducedFrom[machine] = 1;
          slice->reducedArrived = std::move(fence);
        }
        if (launchesAhead_) {
          const bool laneDone = lane == rails::kShards
              ? slice->shardsReceived == peers
              : slice->reducedReceived == peers;
          if (laneDone) {
            signalLocked(
                lane == rails::kShards ? Signal::kShardsArrived
                                       : Signal::kReducedArrived,
                slice->ticket);
          }
          allArrived = laneDone && slice->shardsReceived == peers &&
              slice->reducedReceived == peers;
          if (slice->step >= SliceStep::kAwaitShards) {
            slice->step = railsStepLocked(*slice);
          }
        }
      }
      if (allArrived) {
        passFinishGate(slice, /*onOutputStage=*/false);
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
      const rails::Buffer shards = railsBuffer(
          launchesAhead_ ? slice->railsShards[machine] : slice->shards[machine],
          /*send=*/false);
      lanes_->expect(
          machine,
          rails::kShards,
          {slice->tag(rails::kShards),
           shards,
           laneContent(*slice, rails::kShards),
           arrival(machine, rails::kShards, shards)});
    }
    if (slice->op->kind != Collective::kReduceScatter) {
      const rails::Buffer reduced = railsBuffer(
          launchesAhead_ ? railsShardOf(*slice, machine)
                         : shardOf(*slice, machine),
          /*send=*/false);
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
      railsBuffer(shard, /*send=*/true),
      laneContent(*slice, lane),
      // On the transport's thread, once the rails are done with the memory.
      [this, slice, machine] {
        bool lastWritten = false;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          --slice->writesPending;
          --slice->sendsTo[machine];
          lastWritten = launchesAhead_ && --slice->sendsUnwritten == 0;
        }
        if (lastWritten) {
          passFinishGate(slice, /*onOutputStage=*/false);
        }
        progress_.notify_all();
      },
      // Once the peer has it: it is never sent again.
      [this, slice] {
        bool release = false;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          release = --slice->sendsKept == 0 && slice->gathered &&
              lanes_->resends() && !launchesAhead_;
          if (launchesAhead_ && --slice->sendsLeft == 0) {
            signalLocked(Signal::kSendsDone, slice->ticket);
          }
        }
        if (release) {
          slice->lease.reset();
        }
      });
}

} // namespace fairring
