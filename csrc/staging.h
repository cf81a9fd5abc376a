#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace fairring {

// Bytes of staging one slice holds, for slices of at most `sliceBytes`, with
// `localSize` ranks per machine and `machines` machines: a slot (unless it is
// the user's memory, with one rank per machine) and the received shards.
int64_t stagingChunkBytes(int64_t sliceBytes, int localSize, int machines);

struct StagingStats {
  int64_t capacityBytes; // allocated once, at construction
  int64_t chunkBytes;
  int64_t chunks;
  int64_t chunksInUse;
  int64_t peakChunksInUse;
  int64_t leasesGranted;
};

// All staging memory of one engine: one allocation, made at construction, cut
// into equal chunks, one per slice in flight. The number of chunks is thus the
// number of slices that can be in flight; acquire() blocks while all are used.
class StagingPool {
 public:
  class Lease {
   public:
    Lease(StagingPool& pool, int64_t chunk) : pool_(&pool), chunk_(chunk) {}
    Lease(Lease&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)), chunk_(other.chunk_) {}
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      if (pool_ != nullptr) {
        pool_->release(chunk_);
      }
    }
    // The chunk's bytes, as a 1-D uint8 tensor.
    at::Tensor bytes() const {
      return pool_->chunkView(chunk_);
    }

   private:
    StagingPool* pool_;
    int64_t chunk_;
  };

  // `chunkBytes` is rounded up to keep every chunk 64-byte aligned.
  StagingPool(int64_t capacityBytes, int64_t chunkBytes, at::TensorOptions options);

  // Blocks until a chunk is free; returns nullopt if `cancelled()` turns true
  // first (checked whenever the pool is notified, see interrupt()).
  std::optional<Lease> acquire(const std::function<bool()>& cancelled);
  // Wakes acquire() so it rechecks its cancellation predicate.
  void interrupt();

  StagingStats stats() const;
  int64_t chunkBytes() const {
    return chunkBytes_;
  }

 private:
  void release(int64_t chunk);
  at::Tensor chunkView(int64_t chunk) const;

  const int64_t chunkBytes_;
  const int64_t chunks_;
  const at::Tensor memory_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<int64_t> freeChunks_; // guarded by mutex_
  int64_t peakInUse_ = 0; // guarded by mutex_
  int64_t granted_ = 0; // guarded by mutex_
};

} // namespace fairring
