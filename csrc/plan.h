#pragma once

#include <cstdint>
#include <vector>

namespace fairring {

// How one all-reduce of `numel` elements is cut up. Pure arithmetic.
//
// The Herring path handles a prefix of the tensor whose length is a multiple
// of ranksPerMachine x machines, cut into slices of at most `sliceNumel`
// elements, each itself such a multiple: every slice then splits evenly into
// one slot per local rank and one shard per machine, with no padding. The
// remaining tail (fewer than ranksPerMachine x machines elements) goes through
// a flat all-reduce on the whole group.
struct Slice {
  int64_t offset; // in elements, into the flattened tensor
  int64_t numel;
};

struct Plan {
  std::vector<Slice> slices;
  int64_t tailOffset = 0;
  int64_t tailNumel = 0;
};

// Slices an all-reduce is cut into, when it is long enough: fewer, and the
// local steps of the first and last slice are not overlapped with the network.
constexpr int64_t kPipelineDepth = 8;

// The slice size, in bytes, for an all-reduce of `tensorBytes`: at most
// `maxSliceBytes` (FAIRRING_SLICE_SIZE), and smaller for tensors shorter than
// kPipelineDepth such slices so that they pipeline too, but never below a
// quarter of the maximum, where per-slice costs start to show.
int64_t sliceBytesFor(int64_t tensorBytes, int64_t maxSliceBytes);

// The largest slice (in elements) that fits `sliceBytes` and divides evenly:
// a positive multiple of `granule` (ranks per machine x machines).
int64_t sliceNumelFor(int64_t sliceBytes, int64_t elementSize, int64_t granule);

// Slices shorter than `minSliceNumel` (at most the last one, unless
// sliceNumel itself is shorter) join the tail instead.
Plan makePlan(
    int64_t numel,
    int64_t sliceNumel,
    int64_t granule,
    int64_t minSliceNumel = 0);

} // namespace fairring
