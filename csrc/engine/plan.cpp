#include "engine/plan.h"

#include <algorithm>

#include <c10/util/Exception.h>

namespace fairring {

int64_t planUnit(
    int localSize,
    int machines,
    int64_t elementSize,
    int64_t minShardBytes) {
  TORCH_CHECK(
      localSize > 0 && machines > 0 && elementSize > 0 && minShardBytes > 0);
  const int64_t shardNumel = (minShardBytes + elementSize - 1) / elementSize;
  return static_cast<int64_t>(localSize) * machines * shardNumel;
}

int64_t sliceBytesFor(int64_t tensorBytes, int64_t maxSliceBytes) {
  TORCH_CHECK(tensorBytes >= 0 && maxSliceBytes > 0);
  const int64_t floor = std::max<int64_t>(1, maxSliceBytes / 4);
  const int64_t deep = (tensorBytes + kPipelineDepth - 1) / kPipelineDepth;
  return std::clamp(deep, floor, maxSliceBytes);
}

int64_t sliceNumelFor(int64_t sliceBytes, int64_t elementSize, int64_t unit) {
  TORCH_CHECK(sliceBytes > 0 && elementSize > 0 && unit > 0);
  return std::max<int64_t>(1, sliceBytes / elementSize / unit) * unit;
}

std::vector<Slice> makePlan(int64_t numel, int64_t sliceNumel, int64_t unit) {
  TORCH_CHECK(
      numel >= 0 && unit > 0 && sliceNumel > 0 && sliceNumel % unit == 0);
  std::vector<Slice> slices;
  for (int64_t offset = 0; offset < numel; offset += sliceNumel) {
    const int64_t length = std::min(sliceNumel, numel - offset);
    slices.push_back({offset, length, (length + unit - 1) / unit * unit});
  }
  return slices;
}

} // namespace fairring
