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
    int64_t sliceBytes, int localSize, int machines, bool padded) {
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
      memory_(at::empty({capacity_}, options.dtype(at::kByte))),
      extents_(capacity_) {
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
    const std::function<bool()>& cancelled,
    Placement placement) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::optional<Lease> lease;
  freed_.wait(lock, [&] {
    if (cancelled()) {
      return true;
    }
    if (auto placed = placeLocked(bytes, placement)) {
      lease.emplace(std::move(*placed));
    }
    return lease.has_value();
  });
  return lease;
}

std::optional<StagingRing::Lease> StagingRing::tryAcquire(
    int64_t bytes, Placement placement) {
  std::lock_guard<std::mutex> lock(mutex_);
  return placeLocked(bytes, placement);
}

std::optional<int64_t> RingExtents::place(uint64_t id, int64_t size) {
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
  if (begin) {
    extents_.push_back(Extent{id, *begin, *begin + size, false});
  }
  return begin;
}

int64_t RingExtents::release(uint64_t id) {
  auto extent =
      std::find_if(extents_.begin(), extents_.end(), [id](const Extent& e) {
        return e.id == id;
      });
  TORCH_INTERNAL_ASSERT(
      extent != extents_.end() && !extent->released,
      "fairring: staging extent ",
      id,
      " released twice or never reserved; a fairring bug: please report it");
  extent->released = true;
  const int64_t size = extent->end - extent->begin;
  while (!extents_.empty() && extents_.front().released) {
    extents_.pop_front();
  }
  return size;
}

int64_t RingExtents::liveLeases() const {
  return std::count_if(extents_.begin(), extents_.end(), [](const Extent& e) {
    return !e.released;
  });
}

int64_t stagingLeaseBytes(int64_t bytes) {
  return alignUp(std::max<int64_t>(bytes, 1));
}

int64_t stagingWindow(
    int64_t capacity, const std::vector<int64_t>& leaseBytes) {
  const int64_t leases = static_cast<int64_t>(leaseBytes.size());
  const int64_t ringBytes = capacity / kAlignment * kAlignment;
  const int64_t smallest = leaseBytes.empty()
      ? 1
      : stagingLeaseBytes(
            *std::min_element(leaseBytes.begin(), leaseBytes.end()));
  // Replays the ring: lease s is taken once lease s - window is back.
  const auto fits = [&](int64_t window) {
    RingExtents ring(ringBytes);
    for (int64_t s = 0; s < leases; ++s) {
      if (s >= window) {
        ring.release(static_cast<uint64_t>(s - window));
      }
      if (!ring.place(
              static_cast<uint64_t>(s), stagingLeaseBytes(leaseBytes[s]))) {
        return false;
      }
    }
    return true;
  };
  for (int64_t window = std::min(leases, ringBytes / smallest); window > 1;
       --window) {
    if (fits(window)) {
      return window;
    }
  }
  return 1;
}

std::optional<StagingRing::Lease> StagingRing::placeLocked(
    int64_t bytes, Placement placement) {
  const int64_t size = stagingLeaseBytes(bytes);
  TORCH_CHECK(
      size <= capacity_,
      "fairring: a slice needs ",
      size,
      " bytes of staging but FAIRRING_TOTAL_MEMORY holds only ",
      capacity_);
  if (placement == Placement::kEmptyRing && !extents_.empty()) {
    return std::nullopt;
  }
  const auto begin = extents_.place(nextId_, size);
  if (!begin) {
    return std::nullopt;
  }
  const uint64_t id = nextId_++;
  bytesInUse_ += size;
  peakBytesInUse_ = std::max(peakBytesInUse_, bytesInUse_);
  peakLeasesInUse_ = std::max(peakLeasesInUse_, extents_.liveLeases());
  return Lease(*this, id, *begin, size);
}

void StagingRing::release(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    bytesInUse_ -= extents_.release(id);
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
      extents_.liveLeases(),
      peakLeasesInUse_,
      static_cast<int64_t>(nextId_)};
}

} // namespace fairring
