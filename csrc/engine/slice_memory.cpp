#include <torch_headers.h> // first: the precompiled torch headers

// Where a slice's elements lie: its staging (and, launching ahead, the
// rails' copy of it), its shards, and the rows of a reduce-scatter or an
// all-gather moved between the caller's chunks and staging. (slices.cpp
// runs the steps that use them.)

#include <algorithm>
#include <cstddef>
#include <cstring>

#include <c10/util/Exception.h>

#include "engine/engine.h"
#include "engine/ops.h"

namespace fairring {

at::Tensor Engine::stagedRows(const SliceWork& slice) const {
  return slice.padded.view({slice.rows, slice.plan.paddedNumel})
      .narrow(1, 0, slice.plan.numel);
}

at::Tensor Engine::chunkColumns(
    const SliceWork& slice, const at::Tensor& flat) const {
  return flat.view({slice.rows, slice.op->chunkNumel})
      .narrow(1, slice.plan.offset, slice.plan.numel);
}

void Engine::moveRows(
    const SliceWork& slice, const at::Tensor& columns, bool toStaging) const {
  at::Tensor staged = stagedRows(slice);
  const bool rowsContiguous = staged.stride(1) == 1 && columns.stride(1) == 1;
  if (!columns.is_cpu() || !rowsContiguous ||
      staged.scalar_type() != columns.scalar_type()) {
    if (toStaging) {
      staged.copy_(columns.index_select(0, rowRanks_));
    } else {
      columns.index_copy_(0, rowRanks_, staged);
    }
    return;
  }
  // Raw copies: the shapes the offsets come from are checked first.
  TORCH_CHECK(
      staged.size(0) == static_cast<int64_t>(rowRankList_.size()) &&
          columns.size(0) == staged.size(0) &&
          columns.size(1) == staged.size(1),
      "fairring: moving ",
      staged.size(0),
      " staged rows of ",
      staged.size(1),
      " elements for ",
      rowRankList_.size(),
      " ranks into ",
      columns.sizes(),
      "; a fairring bug: please report it");
  const int64_t rowBytes = staged.size(1) * staged.element_size();
  auto* stagedBase = static_cast<std::byte*>(staged.data_ptr());
  auto* columnsBase = static_cast<std::byte*>(columns.data_ptr());
  const int64_t stagedStride = staged.stride(0) * staged.element_size();
  const int64_t columnsStride = columns.stride(0) * columns.element_size();
  for (size_t row = 0; row < rowRankList_.size(); ++row) {
    std::byte* stagedRow =
        stagedBase + static_cast<int64_t>(row) * stagedStride;
    std::byte* columnsRow = columnsBase + rowRankList_[row] * columnsStride;
    if (toStaging) {
      std::memcpy(stagedRow, columnsRow, rowBytes);
    } else {
      std::memcpy(columnsRow, stagedRow, rowBytes);
    }
  }
}

bool Engine::gatherIntoRows(const SliceWork& slice) const {
  const at::Tensor columns = chunkColumns(slice, slice.op->tensor);
  if (!localSteps_->placesParts() || !columns.is_cpu() ||
      columns.stride(1) != 1 ||
      columns.scalar_type() != slice.slot.scalar_type()) {
    return false;
  }
  const int machines = topology_.numMachines();
  // Raw copies: the shapes the offsets come from are checked first.
  TORCH_CHECK(
      slice.slot.numel() == machines * slice.plan.paddedNumel &&
          columns.size(0) == static_cast<int64_t>(rowRankList_.size()) &&
          columns.size(1) == slice.plan.numel,
      "fairring: placing a slot of ",
      slice.slot.numel(),
      " elements (",
      machines,
      " shards of ",
      slice.plan.paddedNumel,
      ") into ",
      columns.sizes(),
      "; a fairring bug: please report it");
  const int64_t elementSize = columns.element_size();
  const int64_t shardBytes = slice.plan.paddedNumel * elementSize;
  const int64_t keptBytes = slice.plan.numel * elementSize; // no padding
  const int64_t rowBytes = columns.stride(0) * elementSize;
  auto* base = static_cast<std::byte*>(columns.data_ptr());
  localSteps_->allGatherPlaced(
      slice.slot,
      [&](int rank, int64_t offset, const std::byte* data, int64_t length) {
        // Part `rank` is its machines' shards end to end: row rank x M + m.
        for (int64_t m = offset / shardBytes;
             m < machines && m * shardBytes < offset + length;
             ++m) {
          const int64_t from = std::max(offset, m * shardBytes);
          const int64_t to =
              std::min(offset + length, m * shardBytes + keptBytes);
          if (from < to) {
            std::byte* row =
                base + rowRankList_[rank * machines + m] * rowBytes;
            std::memcpy(
                row + (from - m * shardBytes),
                data + (from - offset),
                to - from);
          }
        }
      },
      slice.localStepKey(),
      slice.op->deadline);
  return true;
}

void Engine::attachStaging(
    SliceWork& slice, StagingRing::Lease lease, const StagingLayout& layout) {
  const int localSize = topology_.localSize();
  const auto dtype = slice.op->elements.scalar_type();
  const int64_t elementSize = slice.op->elements.element_size();
  const int64_t paddedNumel = slice.stagedNumel();
  const int64_t slotNumel = paddedNumel / localSize;
  at::Tensor bytes = lease.bytes();
  auto view = [&](int64_t offset, int64_t numel) {
    return bytes.narrow(0, offset, numel * elementSize).view(dtype);
  };
  slice.parts = view(0, localSize * slotNumel).view({localSize, slotNumel});
  slice.slot = slice.parts[0];
  slice.shards =
      view(layout.shardsOffset, slotNumel).view({topology_.numMachines(), -1});
  if (slice.staged()) {
    slice.padded = view(layout.paddedOffset, paddedNumel);
  }
  if (launchesAhead_) {
    at::Tensor railsBytes =
        railsStaging_.narrow(0, lease.offset(), lease.size());
    auto railsView = [&](int64_t offset, int64_t numel) {
      return railsBytes.narrow(0, offset, numel * elementSize).view(dtype);
    };
    slice.railsSlot = railsView(0, slotNumel);
    slice.railsShards = railsView(layout.shardsOffset, slotNumel)
                            .view({topology_.numMachines(), -1});
  }
  slice.lease.emplace(std::move(lease));
}

at::Tensor Engine::shardOf(const SliceWork& slice, int machine) const {
  const int64_t shardNumel = slice.slot.numel() / topology_.numMachines();
  return slice.slot.narrow(0, machine * shardNumel, shardNumel);
}

at::Tensor Engine::railsShardOf(const SliceWork& slice, int machine) const {
  const int64_t shardNumel = slice.railsSlot.numel() / topology_.numMachines();
  return slice.railsSlot.narrow(0, machine * shardNumel, shardNumel);
}

} // namespace fairring
