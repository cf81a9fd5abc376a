#include "staging.h"

#include <algorithm>

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

namespace fairring {

namespace {
constexpr int64_t kAlignment = 64;

int64_t alignUp(int64_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}
} // namespace

int64_t stagingChunkBytes(int64_t sliceBytes, int localSize, int machines) {
  // A slice is at least one element per (local rank, machine) pair.
  constexpr int64_t kLargestElement = 8;
  const int64_t granule = static_cast<int64_t>(localSize) * machines;
  const int64_t slot =
      alignUp(std::max(sliceBytes, granule * kLargestElement) / localSize);
  return (localSize > 1 ? 2 : 1) * slot;
}

StagingPool::StagingPool(
    int64_t capacityBytes,
    int64_t chunkBytes,
    at::TensorOptions options)
    : chunkBytes_(alignUp(chunkBytes)),
      chunks_(capacityBytes / chunkBytes_),
      memory_(at::empty({chunks_ * chunkBytes_}, options.dtype(at::kByte))) {
  TORCH_CHECK(
      chunks_ >= 1,
      "fairring: staging memory of ",
      capacityBytes,
      " bytes cannot hold one slice, which needs ",
      chunkBytes_,
      " bytes");
  for (int64_t chunk = chunks_ - 1; chunk >= 0; --chunk) {
    freeChunks_.push_back(chunk);
  }
}

std::optional<StagingPool::Lease> StagingPool::acquire(
    const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mutex_);
  freed_.wait(lock, [&] { return !freeChunks_.empty() || cancelled(); });
  if (cancelled()) {
    return std::nullopt;
  }
  const int64_t chunk = freeChunks_.back();
  freeChunks_.pop_back();
  ++granted_;
  peakInUse_ = std::max(
      peakInUse_, chunks_ - static_cast<int64_t>(freeChunks_.size()));
  return Lease(*this, chunk);
}

void StagingPool::interrupt() {
  std::lock_guard<std::mutex> lock(mutex_);
  freed_.notify_all();
}

void StagingPool::release(int64_t chunk) {
  std::lock_guard<std::mutex> lock(mutex_);
  freeChunks_.push_back(chunk);
  freed_.notify_all();
}

at::Tensor StagingPool::chunkView(int64_t chunk) const {
  return memory_.narrow(0, chunk * chunkBytes_, chunkBytes_);
}

StagingStats StagingPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return StagingStats{
      memory_.numel(),
      chunkBytes_,
      chunks_,
      chunks_ - static_cast<int64_t>(freeChunks_.size()),
      peakInUse_,
      granted_};
}

} // namespace fairring
