#pragma once

// FAIRRING_FLAT_THRESHOLD=auto: what a group hands the measurement, and what
// the measurement decides. fairring/_dispatch.py measures; the Backend asks
// for it once per device type and collective kind (all-reduce,
// reduce-scatter, all-gather), at the group's first one of that kind the
// engine could take, and routes that kind by its answer from then on.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace fairring {

// One size of the sweep: the slowest rank's median seconds on each path.
struct MeasuredSize {
  int64_t bytes = 0;
  double engineSeconds = 0;
  double delegateSeconds = 0;
};

struct MeasuredThreshold {
  // The engine from this size up, the delegate below; the largest int64
  // where the engine never won, or disagreed with the delegate.
  int64_t thresholdBytes = 0;
  // The delegate again from this size up, where the engine lost above the
  // sizes it won; the largest int64 where it did not.
  int64_t ceilingBytes = 0;
  // Why, in a sentence (the INFO line): "engine 1.48x gloo from 1MiB; ...".
  std::string reason;
  // "measured", or "cache" where an earlier job's measurement was reused.
  std::string source;
  std::vector<MeasuredSize> sizes;
};

// One collective of the kind measured, SUM where it reduces, of `input` into
// `output` (one tensor for an all-reduce; the N-chunk one is a
// reduce-scatter's input and an all-gather's output) over the group, on the
// engine or on the delegate, as one of the group's collectives; returns once
// it is done (for CUDA tensors: once the current stream waits for it).
using CollectiveOnPath =
    std::function<void(at::Tensor& output, at::Tensor& input, bool onEngine)>;

} // namespace fairring
