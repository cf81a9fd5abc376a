#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace fairring {

// Which slice a local step works on: every rank of a machine passes the same
// key for the same step, or they issued different all-reduces.
struct LocalStepKey {
  uint64_t seq = 0; // the engine's op number
  uint64_t collective = 0; // the group's, for errors
  uint64_t slice = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM;
};

// The engine's steps among the ranks of one machine: one implementation per
// algorithm (local/shared_memory.h, local/group_steps.h, local/copy_steps.h),
// chosen once per engine from LocalGroups (backend/engine_factory.cpp).
//
// Threads: the reduce-scatter stage calls reduceScatter and the all-gather
// stage allGather, each in slice order (the same on every local rank, c10d's
// rule), inside the work it enqueues on its device queue: on CUDA, the
// stage's stream is the current one (docs/design.md, "Streams and fences").
// abort() from any thread; join() from the engine's owner once the device's
// queues are joined.
class LocalSteps {
 public:
  using Clock = std::chrono::steady_clock;

  virtual ~LocalSteps() = default;

  // slot = `op` over local ranks r of rank r's part `localRank` of `input`,
  // split in as many equal parts. `parts` ([localSize, slot]) is staging the
  // step may use. Gives up at `deadline` (the op's); throws at once after
  // abort(). `key` names the slice, the same on every local rank.
  virtual void reduceScatter(
      at::Tensor& slot,
      at::Tensor& parts,
      const at::Tensor& input,
      c10d::ReduceOp::RedOpType op,
      const LocalStepKey& key,
      Clock::time_point deadline) = 0;
  // output = every rank's `part`, in local-rank order.
  virtual void allGather(
      at::Tensor& output,
      const at::Tensor& part,
      const LocalStepKey& key,
      Clock::time_point deadline) = 0;
  // Where allGatherPlaced puts bytes [offset, offset + length) of local rank
  // `rank`'s part, given at `data` (host memory, valid for the call only).
  using Place = std::function<void(
      int rank, int64_t offset, const std::byte* data, int64_t length)>;
  // Whether allGatherPlaced hands each part's bytes to `place` as they come,
  // with no gathered copy in between (host memory only).
  virtual bool placesParts() const {
    return false;
  }
  // Every rank's `part` (contiguous, host memory), each byte handed to
  // `place` once; only where placesParts().
  virtual void allGatherPlaced(
      const at::Tensor& /*part*/,
      const Place& /*place*/,
      const LocalStepKey& /*key*/,
      Clock::time_point /*deadline*/) {
    TORCH_CHECK(false, "fairring: ", name(), " steps cannot place parts");
  }

  // What runs them: "shared memory", the groups' backend ("gloo", "nccl"),
  // or "none" with one rank per machine.
  virtual std::string name() const = 0;

  // The group's timeout, set when the engine is made and by set_timeout:
  // where a step's own watchdog times it by its group's timeout rather than
  // the op's (NCCL), the steps launched from now on get this one, and enough
  // more that the engine's watchdog, which names the cause, fails first.
  virtual void setTimeout(std::chrono::milliseconds /*timeout*/) {}
  // Steps in flight and later ones throw at once. Any thread; idempotent.
  virtual void abort() = 0;
  // A normal shutdown, instead of abort(): no step is pending and the
  // device has finished the steps launched here. What still runs on other
  // ranks finishes first where the steps can say so (NCCL flushes what it
  // sends); the wait is bounded. Any thread; once.
  virtual void close() {
    abort();
  }
  // After abort() or close(), once nothing calls a step any more: the
  // steps' own threads are joined, each for a bounded time.
  virtual void join() {}
};

// What Python made for the local steps of a machine with 2+ ranks
// (fairring/_registration.py): either shared memory (CPU, where every local
// rank could map every other's segment), or a group per step, made by
// torch's own constructors. Empty with one rank per machine.
struct LocalGroups {
  c10::intrusive_ptr<c10d::Backend> reduceScatter;
  c10::intrusive_ptr<c10d::Backend> allGather;
  std::shared_ptr<LocalSteps> sharedMemory;
};

} // namespace fairring
