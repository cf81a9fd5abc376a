#include "engine/staging.h"

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

StagingLayout stagingLayoutFor(
    int64_t sliceBytes,
    int localSize,
    int machines,
    bool padded) {
  // A slice is at least one element per (local rank, machine) pair.
  constexpr int64_t kLargestElement = 8;
  const int64_t granule = static_cast<int64_t>(localSize) * machines;
  const int64_t slot =
      alignUp(std::max(sliceBytes, granule * kLargestElement) / localSize);
  const int64_t shardsOffset = localSize * slot;
  const int64_t paddedOffset = shardsOffset + slot;
  return StagingLayout{
      slot,
      shardsOffset,
      paddedOffset,
      paddedOffset + (padded ? localSize * slot : 0)};
}

at::Tensor StagingRing::Lease::bytes() const {
  TORCH_CHECK(ring_ != nullptr, "fairring: staging lease already released");
  return ring_->memory_.narrow(0, offset_, bytes_);
}

void StagingRing::Lease::release() {
  if (ring_ != nullptr) {
    std::exchange(ring_, nullptr)->release(id_);
  }
}

StagingRing::StagingRing(int64_t capacityBytes, at::TensorOptions options)
    : capacity_(capacityBytes / kAlignment * kAlignment),
      memory_(at::empty({capacity_}, options.dtype(at::kByte))) {
  TORCH_CHECK(
      capacity_ > 0,
      "fairring: staging memory of ",
      capacityBytes,
      " bytes is less than one ",
      kAlignment,
      "-byte line");
}

std::optional<StagingRing::Lease> StagingRing::acquire(
    int64_t bytes,
    const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::optional<Lease> lease;
  freed_.wait(lock, [&] {
    if (cancelled()) {
      return true;
    }
    if (auto placed = placeLocked(bytes)) {
      lease.emplace(std::move(*placed));
    }
    return lease.has_value();
  });
  return lease;
}

std::optional<StagingRing::Lease> StagingRing::tryAcquire(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  return placeLocked(bytes);
}

std::optional<StagingRing::Lease> StagingRing::placeLocked(int64_t bytes) {
  const int64_t size = alignUp(std::max<int64_t>(bytes, 1));
  TORCH_CHECK(
      size <= capacity_,
      "fairring: a slice needs ",
      size,
      " bytes of staging but FAIRRING_TOTAL_MEMORY holds only ",
      capacity_);
  // Live leases occupy [oldest.begin, newest.end), wrapping at most once.
  std::optional<int64_t> begin;
  if (extents_.empty()) {
    begin = 0;
  } else {
    const int64_t oldest = extents_.front().begin;
    const int64_t head = extents_.back().end;
    const bool wrapped = extents_.back().begin < oldest;
    if (wrapped) {
      if (head + size <= oldest) {
        begin = head;
      }
    } else if (head + size <= capacity_) {
      begin = head;
    } else if (size <= oldest) {
      begin = 0; // the rest of the end stays unused until this wraps again
    }
  }
  if (!begin) {
    return std::nullopt;
  }
  const uint64_t id = nextId_++;
  extents_.push_back(Extent{id, *begin, *begin + size, false});
  bytesInUse_ += size;
  peakBytesInUse_ = std::max(peakBytesInUse_, bytesInUse_);
  peakLeasesInUse_ = std::max(peakLeasesInUse_, leasesInUseLocked());
  return Lease(*this, id, *begin, size);
}

int64_t StagingRing::leasesInUseLocked() const {
  return std::count_if(extents_.begin(), extents_.end(), [](const Extent& e) {
    return !e.released;
  });
}

void StagingRing::release(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto extent = std::find_if(
        extents_.begin(), extents_.end(), [id](const Extent& e) {
          return e.id == id;
        });
    TORCH_INTERNAL_ASSERT(extent != extents_.end() && !extent->released);
    extent->released = true;
    bytesInUse_ -= extent->end - extent->begin;
    while (!extents_.empty() && extents_.front().released) {
      extents_.pop_front();
    }
  }
  freed_.notify_all();
}

void StagingRing::interrupt() {
  std::lock_guard<std::mutex> lock(mutex_);
  freed_.notify_all();
}

StagingStats StagingRing::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return StagingStats{
      capacity_,
      bytesInUse_,
      peakBytesInUse_,
      leasesInUseLocked(),
      peakLeasesInUse_,
      static_cast<int64_t>(nextId_)};
}

} // namespace fairring
