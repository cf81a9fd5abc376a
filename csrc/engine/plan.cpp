#include "engine/plan.h"

#include <algorithm>

#include <c10/util/Exception.h>

#include "engine/staging.h"

namespace fairring {

int64_t planUnit(
    int localSize, int machines, int64_t elementSize, int64_t minShardBytes) {
  TORCH_CHECK(
      localSize > 0 && machines > 0 && elementSize > 0 && minShardBytes > 0,
      "fairring: cannot plan for ",
      localSize,
      " local ranks on ",
      machines,
      " machines with ",
      elementSize,
      "-byte elements and a ",
      minShardBytes,
      "-byte transport shard floor: each must be positive; this is a "
      "fairring bug: please report it with the settings in use");
  const int64_t shardNumel = (minShardBytes + elementSize - 1) / elementSize;
  return static_cast<int64_t>(localSize) * machines * shardNumel;
}

int64_t sliceBytesFor(int64_t tensorBytes, int64_t maxSliceBytes) {
  TORCH_CHECK(
      tensorBytes >= 0 && maxSliceBytes > 0,
      "fairring: cannot slice ",
      tensorBytes,
      " bytes into slices of at most ",
      maxSliceBytes,
      ": FAIRRING_SLICE_SIZE must be positive");
  const int64_t floor = std::max<int64_t>(1, maxSliceBytes / 2);
  const int64_t deep = (tensorBytes + kPipelineDepth - 1) / kPipelineDepth;
  return std::clamp(deep, floor, maxSliceBytes);
}

int64_t sliceNumelFor(int64_t sliceBytes, int64_t elementSize, int64_t unit) {
  TORCH_CHECK(
      sliceBytes > 0 && elementSize > 0 && unit > 0,
      "fairring: a slice of ",
      sliceBytes,
      " bytes of ",
      elementSize,
      "-byte elements in units of ",
      unit,
      " elements: each must be positive; this is a fairring bug: please "
      "report it with the settings in use");
  return std::max<int64_t>(1, sliceBytes / elementSize / unit) * unit;
}

std::vector<Slice> makePlan(int64_t numel, int64_t sliceNumel, int64_t unit) {
  TORCH_CHECK(
      numel >= 0 && unit > 0 && sliceNumel > 0 && sliceNumel % unit == 0,
      "fairring: cannot cut ",
      numel,
      " elements into slices of ",
      sliceNumel,
      ", which must be a positive multiple of the unit, ",
      unit,
      "; this is a fairring bug: please report it with the settings in use");
  std::vector<Slice> slices;
  for (int64_t offset = 0; offset < numel; offset += sliceNumel) {
    const int64_t length = std::min(sliceNumel, numel - offset);
    slices.push_back({offset, length, (length + unit - 1) / unit * unit});
  }
  return slices;
}

namespace {

int64_t stagingBytesOf(
    int64_t numel,
    int64_t elementSize,
    const PlanSettings& settings,
    bool padded) {
  return stagingLayoutFor(
             numel * elementSize, settings.localSize, settings.machines, padded)
      .bytes;
}

// The longest slice, a multiple of `unit`, of which two fit the staging
// memory (and a padded last one alone); one unit if none does.
int64_t longestSliceInFlightTwice(
    int64_t elementSize, int64_t unit, const PlanSettings& settings) {
  const int64_t budget = settings.totalMemoryBytes / 2;
  const auto fits = [&](int64_t numel) {
    return stagingBytesOf(numel, elementSize, settings, /*padded=*/false) <=
        budget &&
        stagingBytesOf(numel, elementSize, settings, /*padded=*/true) <=
        settings.totalMemoryBytes;
  };
  // A full slice's staging is (1 + 1/L) x its bytes (staging.h); alignment
  // adds a little, taken off a unit at a time.
  const int64_t estimate = budget * settings.localSize /
      (settings.localSize + 1) / elementSize / unit * unit;
  int64_t numel = std::max(unit, estimate);
  while (numel > unit && !fits(numel)) {
    numel -= unit;
  }
  return numel;
}

} // namespace

PlanShape planShape(
    int64_t numel, int64_t elementSize, const PlanSettings& settings) {
  TORCH_CHECK(
      numel >= 0 && settings.minShardBytes >= 0 &&
          settings.maxSlicesInFlight > 0,
      "fairring: cannot plan ",
      numel,
      " elements with a shard floor of ",
      settings.minShardBytes,
      " bytes and ",
      settings.maxSlicesInFlight,
      " slices in flight: FAIRRING_MIN_SHARD_SIZE must not be negative and "
      "FAIRRING_SLICES_IN_FLIGHT must be positive");
  const int64_t ranks =
      static_cast<int64_t>(settings.localSize) * settings.machines;
  const int64_t unit = planUnit(
      settings.localSize,
      settings.machines,
      elementSize,
      settings.transportMinShardBytes);
  int64_t sliceNumel = sliceNumelFor(
      sliceBytesFor(numel * elementSize, settings.maxSliceBytes),
      elementSize,
      unit);
  const int64_t floorNumel =
      (ranks * settings.minShardBytes + elementSize - 1) / elementSize;
  bool belowFloor = false;
  if (sliceNumel < floorNumel) {
    const int64_t grown = (floorNumel + unit - 1) / unit * unit;
    const int64_t longest =
        longestSliceInFlightTwice(elementSize, unit, settings);
    sliceNumel = std::max(sliceNumel, std::min(grown, longest));
    // Only a tensor cut into several slices was cut too fine.
    belowFloor = sliceNumel < grown && numel > sliceNumel;
  }
  const int64_t slices = (numel + sliceNumel - 1) / sliceNumel;
  // A tensor of one slice has shards as long as it is, padded to the unit.
  const int64_t longestSlice =
      std::min(sliceNumel, (numel + unit - 1) / unit * unit);
  const int64_t stagingBytes =
      stagingBytesOf(sliceNumel, elementSize, settings, /*padded=*/false);
  return PlanShape{
      unit,
      sliceNumel,
      slices,
      longestSlice * elementSize / ranks,
      stagingBytes,
      std::min(
          settings.totalMemoryBytes / stagingBytes, settings.maxSlicesInFlight),
      belowFloor};
}

int64_t stagingCapacity(const PlanSettings& settings) {
  // Slices are longest for the longest tensors (sliceBytesFor grows with the
  // tensor; the floor does not depend on it). Units round per element size.
  constexpr int64_t kLongestTensorBytes = int64_t{1} << 50;
  int64_t needed = 0;
  for (const int64_t elementSize : {1, 2, 4, 8, 16}) {
    const PlanShape shape =
        planShape(kLongestTensorBytes / elementSize, elementSize, settings);
    needed = std::max(
        {needed,
         settings.maxSlicesInFlight * shape.stagingBytes,
         stagingBytesOf(
             shape.sliceNumel, elementSize, settings, /*padded=*/true)});
  }
  return std::min(needed, settings.totalMemoryBytes);
}

} // namespace fairring
