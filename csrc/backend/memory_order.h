#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace fairring {

// Orders a group's collectives that touch the same memory, as NCCL orders
// every collective of a group on its one stream: `all_reduce(t,
// async_op=True)` twice gives world_size**2 * t, and a broadcast followed by
// an all-reduce of the same tensor reduces what was broadcast.
//
// fairring runs a group's collectives on several executors that do not order
// each other: the engine (three stage threads, which read an op's first slice
// as soon as it is issued), Gloo (a pool of worker threads) and NCCL. So a
// collective whose memory overlaps that of an earlier one still in flight,
// on another executor or on one that does not order itself (the engine,
// Gloo), first waits for it on the issuing thread: Work::wait(), which on
// CUDA makes the caller's current stream wait for the earlier op's events
// rather than the host for the GPU. NCCL orders its own, so one NCCL
// collective never waits for another.
//
// Memory is compared by byte extent (first to last element), so views of one
// buffer that do not overlap (a gradient buffer's buckets) stay concurrent.
// Point-to-point operations are not ordered: c10d leaves their pairing to the
// user, and an isend that waits for its peer's irecv could never complete.
// Threads: the caller's (c10d issues a group's collectives from one thread
// at a time); the lock guards against the rest.
class MemoryOrder {
 public:
  enum class Executor { kEngine, kGloo, kNccl };

  // The earlier collectives in flight whose memory overlaps `tensors`, on
  // this executor or one that does not order itself against it, each
  // waited for up to `timeout` (an op that outlives it fails by its own
  // timeout, and the group with it); NCCL's with no timeout, which makes the
  // caller's stream wait rather than the host. Their errors are theirs: not
  // rethrown.
  void awaitOverlapping(
      const std::vector<at::Tensor>& tensors,
      Executor executor,
      std::chrono::milliseconds timeout);

  // `work` touches `tensors` until it completes.
  void track(
      const std::vector<at::Tensor>& tensors,
      Executor executor,
      c10::intrusive_ptr<c10d::Work> work);

  // A test's negative control: with ordering off, two in-flight all-reduces
  // of one tensor race again. Process-wide; never set outside tests.
  static void setEnabledForTests(bool enabled);

 private:
  struct Extent {
    c10::Device device;
    uintptr_t begin; // bytes, [begin, end)
    uintptr_t end;
  };
  struct Entry {
    std::vector<Extent> extents;
    Executor executor;
    c10::intrusive_ptr<c10d::Work> work;
  };

  static std::vector<Extent> extentsOf(const std::vector<at::Tensor>& tensors);
  static bool overlap(
      const std::vector<Extent>& a, const std::vector<Extent>& b);

  std::mutex mutex_;
  std::vector<Entry> inFlight_; // may hold completed ones until the next call
};

} // namespace fairring
