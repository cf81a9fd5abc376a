#include "plan.h"

#include <algorithm>

#include <c10/util/Exception.h>

namespace fairring {

int64_t sliceBytesFor(int64_t tensorBytes, int64_t maxSliceBytes) {
  TORCH_CHECK(tensorBytes >= 0 && maxSliceBytes > 0);
  const int64_t floor = std::max<int64_t>(1, maxSliceBytes / 4);
  const int64_t deep = (tensorBytes + kPipelineDepth - 1) / kPipelineDepth;
  return std::clamp(deep, floor, maxSliceBytes);
}

int64_t sliceNumelFor(
    int64_t sliceBytes,
    int64_t elementSize,
    int64_t granule) {
  TORCH_CHECK(sliceBytes > 0 && elementSize > 0 && granule > 0);
  return std::max<int64_t>(1, sliceBytes / elementSize / granule) * granule;
}

Plan makePlan(
    int64_t numel,
    int64_t sliceNumel,
    int64_t granule,
    int64_t minSliceNumel) {
  TORCH_CHECK(
      numel >= 0 && granule > 0 && sliceNumel > 0 &&
      sliceNumel % granule == 0);
  Plan plan;
  const int64_t even = numel / granule * granule;
  int64_t offset = 0;
  for (; offset < even; offset += sliceNumel) {
    const int64_t length = std::min(sliceNumel, even - offset);
    if (length < minSliceNumel) {
      break;
    }
    plan.slices.push_back({offset, length});
  }
  plan.tailOffset = std::min(offset, even);
  plan.tailNumel = numel - plan.tailOffset;
  return plan;
}

} // namespace fairring
