#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/Stream.h>
#include <tensorpipe/common/buffer.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "config.h"
#include "rails.h"
#include "staging.h"
#include "topology.h"

namespace fairring {

struct EngineStats {
  int64_t ops;
  int64_t slices;
  int64_t flatOps; // tails and whole small tensors sent through the flat group
  int64_t railBytesSent;
  int64_t railBytesReceived;
};

// The Herring all-reduce for one process group and one device: the CPU, or
// one CUDA device.
//
// An all-reduce is cut into slices (see plan.h). Each slice lives through:
//
//   1. local reduce-scatter   (this machine's ranks; each gets its slot)
//   2. rails out              (shard m of the slot to the rail peer on machine m)
//   3. reduce                 (this rank's shard of every machine, in one pass)
//   4. rails back             (the reduced shard to every rail peer)
//   5. local all-gather       (the machine's slots back into the user's tensor)
//
// Three threads, one per stage that does work, each taking slices strictly in
// issue order: the reduce-scatter thread (acquires staging, runs step 1,
// sends step 2), the reduce thread (waits for the shards, runs step 3, sends
// step 4) and the all-gather thread (waits for the reduced shards, runs step 5,
// releases staging, completes the op). Each local step has its own inner
// group, fed in slice order by one thread, so ranks never interleave them
// differently. Slices of different ops overlap freely, bounded by staging.
//
// TensorPipe's loop thread only records arrivals and starts the next read.
// A failure anywhere fails every pending op and every later one, naming the
// stage, op and peer; the engine does not recover.
//
// On CUDA, every kernel, copy and transfer of the engine is queued on one
// stream of its own, current on all three stage threads: queue order is then
// GPU order, so the host never waits for the GPU. An op's input is ordered
// after the caller's stream when it is issued, and its future carries events
// on the engine stream, which DDP hooks and wait() order the caller after.
// NCCL groups stand in for the local Gloo groups.
class Engine {
 public:
  struct Groups {
    // Over this machine's ranks; null when a machine has a single rank.
    c10::intrusive_ptr<c10d::Backend> reduceScatter;
    c10::intrusive_ptr<c10d::Backend> allGather;
    // Over the whole group, for tails and small tensors.
    c10::intrusive_ptr<c10d::Backend> flat;
  };

  Engine(
      const Topology& topology,
      const Config& config,
      c10::Device device,
      Groups groups,
      std::unique_ptr<Rails> rails);
  ~Engine();

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Whether the engine reduces tensors of this dtype with this op (else:
  // delegate). The device is the caller's to check.
  static bool handles(const at::Tensor& tensor, c10d::ReduceOp::RedOpType op);

  c10::Device device() const {
    return device_;
  }

  // Starts an all-reduce of `tensor` (on device()), in place. Must be called
  // in the same order on every rank (c10d's rule). The future holds [tensor]
  // when done.
  c10::intrusive_ptr<c10::ivalue::Future> allreduce(
      const at::Tensor& tensor,
      c10d::ReduceOp::RedOpType op);

  // Fails all pending and later ops with `reason` and stops the threads.
  void abort(const std::string& reason);

  StagingStats stagingStats() const {
    return staging_.stats();
  }
  std::string describeRails() const {
    return rails_->describe();
  }
  EngineStats stats() const;

 private:
  struct Op;
  struct SliceWork;

  // Runs one stage's loop; an exception escaping it fails the engine.
  void runStage(const char* stage, void (Engine::*loop)());
  void reduceScatterLoop();
  void reduceLoop();
  void allGatherLoop();

  // Waits until the front of `queue` satisfies `ready`, then pops it; null
  // once the engine has failed.
  std::shared_ptr<SliceWork> popWhenReady(
      std::deque<std::shared_ptr<SliceWork>>& queue,
      const std::function<bool(const SliceWork&)>& ready);
  void push(
      std::deque<std::shared_ptr<SliceWork>>& queue,
      std::shared_ptr<SliceWork> slice);

  void attachStaging(
      SliceWork& slice,
      StagingRing::Lease lease,
      const StagingLayout& layout);
  void localReduceScatter(SliceWork& slice);
  void reduceShards(SliceWork& slice);
  // Registers the messages `slice` will receive on both lanes.
  void expectMessages(const std::shared_ptr<SliceWork>& slice);
  void readNext(int machine, Rails::Lane lane);
  void send(
      const std::shared_ptr<SliceWork>& slice,
      Rails::Lane lane,
      int machine,
      const at::Tensor& shard);
  at::Tensor shardOf(const SliceWork& slice, int machine) const;
  tensorpipe::Buffer bufferFor(const at::Tensor& tensor) const;

  void fail(const std::string& message);
  bool failed() const {
    return failed_.load();
  }

  const Topology topology_;
  const Config config_;
  const c10::Device device_;
  const std::optional<c10::Stream> stream_; // the engine stream; CUDA only
  const Groups groups_;
  const int64_t granule_; // ranks per machine x machines
  StagingRing staging_;
  // Reset first in the destructor: its callbacks use the members below.
  std::unique_ptr<Rails> rails_;

  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> nextSeq_{0};
  std::atomic<int64_t> slicesDone_{0};
  std::atomic<int64_t> flatOps_{0};
  std::atomic<int64_t> railBytesSent_{0};
  std::atomic<int64_t> railBytesReceived_{0};

  mutable std::mutex mutex_;
  std::condition_variable progress_; // any change to the state below
  std::deque<std::shared_ptr<SliceWork>> toReduceScatter_;
  std::deque<std::shared_ptr<SliceWork>> toReduce_;
  std::deque<std::shared_ptr<SliceWork>> toAllGather_;
  // By machine and lane: slices expecting a message from that rail peer, in
  // order, and whether a read for the first one is posted.
  std::vector<std::array<std::deque<std::shared_ptr<SliceWork>>, Rails::kLanes>>
      expected_;
  std::vector<std::array<bool, Rails::kLanes>> reading_;
  std::vector<std::weak_ptr<Op>> liveOps_;
  std::string error_;

  // Started last: they use everything above.
  std::array<std::thread, 3> threads_;
};

} // namespace fairring
