#pragma once

#include <cstdint>
#include <vector>

namespace fairring {

// How one all-reduce of `numel` elements is cut up. Pure arithmetic.
//
// Every slice is cut into one slot per local rank and every slot into one
// shard per machine, so a slice must be a multiple of the plan's unit:
// ranksPerMachine x machines x the shortest shard the rails may carry (see
// planUnit). All slices but the last are `sliceNumel` long (a multiple of the
// unit). The last holds whatever remains and is padded up to a multiple of
// the unit in staging: every element takes the same path, and one op is one
// pipeline, whatever its size.
struct Slice {
  int64_t offset; // in elements, into the flattened tensor
  int64_t numel; // elements of the tensor in this slice
  int64_t paddedNumel; // numel rounded up to the unit; equal unless padded

  bool padded() const {
    return paddedNumel != numel;
  }
};

// Slices an all-reduce is cut into, when it is long enough: fewer, and the
// local steps of the first and last slice are not overlapped with the network.
constexpr int64_t kPipelineDepth = 8;

// The unit every (padded) slice is a multiple of: `localSize` x `machines`
// shards of at least `minShardBytes`, in elements of `elementSize` bytes.
int64_t planUnit(
    int localSize,
    int machines,
    int64_t elementSize,
    int64_t minShardBytes);

// The slice size, in bytes, for an all-reduce of `tensorBytes`: at most
// `maxSliceBytes` (FAIRRING_SLICE_SIZE), and smaller for tensors shorter than
// kPipelineDepth such slices so that they pipeline too, but never below a
// quarter of the maximum, where per-slice costs start to show.
int64_t sliceBytesFor(int64_t tensorBytes, int64_t maxSliceBytes);

// The largest slice (in elements) that fits `sliceBytes` and divides evenly:
// a positive multiple of `unit`.
int64_t sliceNumelFor(int64_t sliceBytes, int64_t elementSize, int64_t unit);

// The slices of `numel` elements; none for an empty tensor.
std::vector<Slice> makePlan(int64_t numel, int64_t sliceNumel, int64_t unit);

} // namespace fairring
