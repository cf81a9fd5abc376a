#include <torch_headers.h> // first: the precompiled torch headers

#include "backend/memory_order.h"

#include <algorithm>
#include <atomic>
#include <utility>

namespace fairring {

namespace {

std::atomic<bool> enabled{true};

} // namespace

void MemoryOrder::setEnabledForTests(bool on) {
  enabled = on;
}

std::vector<MemoryOrder::Extent> MemoryOrder::extentsOf(
    const std::vector<at::Tensor>& tensors) {
  std::vector<Extent> extents;
  for (const auto& tensor : tensors) {
    // Sparse tensors are replaced, not written in place, by their collectives.
    if (!tensor.defined() || tensor.layout() != at::kStrided ||
        tensor.numel() == 0) {
      continue;
    }
    int64_t lastElement = 0;
    for (int64_t dim = 0; dim < tensor.dim(); ++dim) {
      lastElement += (tensor.size(dim) - 1) * std::abs(tensor.stride(dim));
    }
    const auto begin = reinterpret_cast<uintptr_t>(tensor.data_ptr());
    extents.push_back(
        Extent{
            tensor.device(),
            begin,
            begin +
                static_cast<uintptr_t>(
                    (lastElement + 1) * tensor.element_size())});
  }
  return extents;
}

bool MemoryOrder::overlap(
    const std::vector<Extent>& a, const std::vector<Extent>& b) {
  for (const auto& x : a) {
    for (const auto& y : b) {
      if (x.device == y.device && x.begin < y.end && y.begin < x.end) {
        return true;
      }
    }
  }
  return false;
}

void MemoryOrder::awaitOverlapping(
    const std::vector<at::Tensor>& tensors,
    Executor executor,
    std::chrono::milliseconds timeout) {
  if (!enabled) {
    return;
  }
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, Executor>> earlier;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(inFlight_, [](const Entry& entry) {
      return entry.work->isCompleted();
    });
    if (inFlight_.empty()) {
      return;
    }
    const auto extents = extentsOf(tensors);
    for (const auto& entry : inFlight_) {
      const bool ordersItself =
          executor == Executor::kNccl && entry.executor == Executor::kNccl;
      if (!ordersItself && overlap(extents, entry.extents)) {
        earlier.emplace_back(entry.work, entry.executor);
      }
    }
  }
  for (const auto& [work, earlierExecutor] : earlier) {
    // NCCL's Work, given a timeout, holds the host until the GPU is done;
    // without one it makes the caller's stream wait, and its watchdog
    // bounds it.
    const auto waitFor =
        earlierExecutor == Executor::kNccl ? kNoTimeout : timeout;
    try {
      work->wait(waitFor);
    } catch (const std::exception&) {
      // Its failure is reported by its own Work, and fails the group.
    }
  }
}

void MemoryOrder::track(
    const std::vector<at::Tensor>& tensors,
    Executor executor,
    c10::intrusive_ptr<c10d::Work> work) {
  if (!enabled || !work || work->isCompleted()) {
    return;
  }
  auto extents = extentsOf(tensors);
  if (extents.empty()) {
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  inFlight_.push_back(Entry{std::move(extents), executor, std::move(work)});
}

} // namespace fairring
