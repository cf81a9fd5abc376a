#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace fairring {

// Where a slice's staging lies in its lease, each part 64-byte aligned:
//   parts   [localSize][slot]: every local rank's part of this rank's slot;
//           row 0 becomes the slot (with one rank per machine, the only row)
//   shards  [machines][shard]: every machine's contribution to this rank's
//           shard
//   padded  [localSize x slot]: the slice copied and padded to a multiple of
//           the plan unit; only for a padded slice (see plan.h)
// The rails only ever touch staging, never the caller's memory.
struct StagingLayout {
  int64_t slotBytes; // one row of parts
  int64_t shardsOffset;
  int64_t paddedOffset; // equal to bytes when not padded
  int64_t bytes; // the whole lease
};

// The layout for a (padded) slice of `sliceBytes`, with `localSize` ranks per
// machine and `machines` machines.
StagingLayout stagingLayoutFor(
    int64_t sliceBytes, int localSize, int machines, bool padded);

// Where a ring's leases lie: live ones occupy [oldest begin, newest end),
// wrapping at most once; a lease is placed after the newest, or at the start
// when the rest of the end is too short. Pure bookkeeping, shared by
// StagingRing and by stagingWindow's replay of it.
class RingExtents {
 public:
  explicit RingExtents(int64_t capacity) : capacity_(capacity) {}

  // Where `size` bytes (a multiple of the alignment) go now, under `id`, or
  // nothing if they do not fit until older leases are back.
  std::optional<int64_t> place(uint64_t id, int64_t size);
  // Gives `id`'s bytes back (returns how many); its space is reused once
  // every older lease is back too.
  int64_t release(uint64_t id);
  int64_t liveLeases() const;
  // No lease is live or waits for an older one: the next goes at the start.
  bool empty() const {
    return extents_.empty();
  }

 private:
  struct Extent {
    uint64_t id;
    int64_t begin;
    int64_t end;
    bool released;
  };

  const int64_t capacity_;
  std::deque<Extent> extents_; // oldest first
};

// The bytes a lease of `bytes` takes: rounded up to the ring's alignment.
int64_t stagingLeaseBytes(int64_t bytes);

// The most leases of `leaseBytes` (in order) that a ring of `capacity` holds
// at once when it starts empty, each lease taken only once the lease `window`
// places before it is back and leases come back in order: the largest such
// window, at least 1, under which no lease ever waits for a later one to come
// back. The engine's launch order (engine/launch_order.h) relies on it.
int64_t stagingWindow(int64_t capacity, const std::vector<int64_t>& leaseBytes);

struct StagingStats {
  int64_t capacityBytes; // allocated once, at construction
  int64_t bytesInUse;
  int64_t peakBytesInUse;
  int64_t leasesInUse;
  int64_t peakLeasesInUse;
  int64_t leasesGranted;
};

// All staging memory of one engine: one allocation, made at construction,
// leased out as a ring. Slices take their lease in issue order and, in normal
// operation, give it back in that order too (the all-gather stage finishes
// slices in issue order), so a ring wastes nothing but the unused end when a
// lease wraps around. Each lease is exactly as large as its slice needs, so a
// small all-reduce does not take a full slice's worth of memory: the number of
// slices in flight is whatever fits. Leases released out of order (on failure)
// are reclaimed once every older lease is back.
class StagingRing {
 public:
  class Lease {
   public:
    Lease(StagingRing& ring, uint64_t id, int64_t offset, int64_t bytes)
        : ring_(&ring), id_(id), offset_(offset), bytes_(bytes) {}
    Lease(Lease&& other) noexcept
        : ring_(std::exchange(other.ring_, nullptr)),
          id_(other.id_),
          offset_(other.offset_),
          bytes_(other.bytes_) {}
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      release();
    }

    // The leased bytes, as a 1-D uint8 tensor.
    at::Tensor bytes() const;
    int64_t offset() const {
      return offset_;
    }
    int64_t size() const {
      return bytes_;
    }
    // Gives the bytes back now rather than at destruction.
    void release();

   private:
    StagingRing* ring_;
    uint64_t id_;
    int64_t offset_;
    int64_t bytes_;
  };

  // The capacity is rounded down to keep every lease 64-byte aligned.
  StagingRing(int64_t capacityBytes, at::TensorOptions options);

  // Where acquire() may place a lease: wherever it fits, or only in an
  // empty ring, at its start, where stagingWindow's replay begins.
  enum class Placement { kAnywhere, kEmptyRing };

  // Blocks until `bytes` fit as `placement` asks; returns nullopt if
  // `cancelled()` turns true first (checked whenever the ring is notified,
  // see interrupt()).
  std::optional<Lease> acquire(
      int64_t bytes,
      const std::function<bool()>& cancelled,
      Placement placement = Placement::kAnywhere);
  // The lease if `bytes` fit now as `placement` asks, else nullopt.
  std::optional<Lease> tryAcquire(
      int64_t bytes, Placement placement = Placement::kAnywhere);
  // Wakes acquire() so it rechecks its cancellation predicate.
  void interrupt();

  StagingStats stats() const;
  int64_t capacity() const {
    return capacity_;
  }
  // All of it, to keep it alive for device work (see DeviceContext).
  const at::Tensor& memory() const {
    return memory_;
  }

 private:
  std::optional<Lease> placeLocked(int64_t bytes, Placement placement);
  void release(uint64_t id);

  const int64_t capacity_;
  const at::Tensor memory_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  RingExtents extents_; // guarded by mutex_
  uint64_t nextId_ = 0; // guarded by mutex_
  int64_t bytesInUse_ = 0; // guarded by mutex_
  int64_t peakBytesInUse_ = 0; // guarded by mutex_
  int64_t peakLeasesInUse_ = 0; // guarded by mutex_
};

} // namespace fairring
