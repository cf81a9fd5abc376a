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
    int localSize, int machines, int64_t elementSize, int64_t minShardBytes);

// The slice size, in bytes, for an all-reduce of `tensorBytes`: at most
// `maxSliceBytes` (FAIRRING_SLICE_SIZE), and smaller for tensors shorter than
// kPipelineDepth such slices so that they pipeline too, but never below half
// the maximum: where the CPU is the limit, per-slice costs dominate shorter
// slices (docs/benchmarks.md, "Unshaped, on loopback").
int64_t sliceBytesFor(int64_t tensorBytes, int64_t maxSliceBytes);

// The largest slice (in elements) that fits `sliceBytes` and divides evenly:
// a positive multiple of `unit`.
int64_t sliceNumelFor(int64_t sliceBytes, int64_t elementSize, int64_t unit);

// The slices of `numel` elements; none for an empty tensor.
std::vector<Slice> makePlan(int64_t numel, int64_t sliceNumel, int64_t unit);

// Everything besides the tensor that shapes its plan: the group's layout, the
// device's transport floor and the user's settings (Config, whose defaults
// live in fairring/_config.py). Equal on every rank.
struct PlanSettings {
  int localSize{};
  int machines{};
  int64_t transportMinShardBytes{}; // DeviceContext::minShardBytes()
  int64_t maxSliceBytes{}; // FAIRRING_SLICE_SIZE
  int64_t minShardBytes{}; // FAIRRING_MIN_SHARD_SIZE; 0: no floor
  int64_t totalMemoryBytes{}; // FAIRRING_TOTAL_MEMORY
  int64_t maxSlicesInFlight{}; // FAIRRING_SLICES_IN_FLIGHT
};

// The plan of one all-reduce, as the engine runs it.
struct PlanShape {
  int64_t unit; // elements, see planUnit
  int64_t sliceNumel; // every slice but the last
  int64_t slices;
  int64_t shardBytes; // what one rank sends a rail peer per slice
  int64_t stagingBytes; // one full slice's lease
  // Full slices in flight at once: as many as the staging memory holds, at
  // most maxSlicesInFlight.
  int64_t slicesInFlight;
  // The plan cut the tensor into shards smaller than the floor, because the
  // staging memory cannot hold two slices that large.
  bool belowFloor;
};

// No over-sharding: a slice is sliceBytesFor's size, grown where needed so
// that its localSize x machines shards are each at least minShardBytes, but
// only as far as the staging memory holds two such slices (two in flight keep
// the network busy while one is reduced). With many machines, slices thus
// grow instead of shards shrinking, until the staging memory runs out.
PlanShape planShape(
    int64_t numel, int64_t elementSize, const PlanSettings& settings);

// The staging memory an engine allocates: maxSlicesInFlight of the longest
// slices any all-reduce is cut into (and at least one padded one, so that
// every slice fits), at most totalMemoryBytes. More slices in flight than the
// network needs to stay busy only queue their shards in the kernels' socket
// buffers, where TCP shares them out unevenly between the connections: some
// receivers then wait on their last shards while other links idle
// (docs/benchmarks.md, "Slices in flight").
int64_t stagingCapacity(const PlanSettings& settings);

} // namespace fairring
