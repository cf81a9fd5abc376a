#pragma once

// Whether a reduce-scatter or an all-gather of whole tensors (c10d's
// reduce_scatter_tensor and all_gather_into_tensor) runs on the engine or on
// the delegate: one pure function of its arguments and the group's settings,
// which every rank gives alike (c10d's rule), so every rank decides alike.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "backend/allreduce_path.h"
#include "config.h"
#include "engine/engine.h"
#include "reduction.h"

namespace fairring {

struct ChunkedArgs {
  Collective kind = Collective::kReduceScatter;
  c10::DeviceType deviceType = c10::kCPU;
  at::ScalarType dtype = at::kFloat;
  c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM; // a reduce-scatter's
  int64_t bytes = 0; // of the N-chunk tensor
  // Both tensors strided, contiguous, of one dtype and one device, the
  // N-chunk one exactly N times the other.
  bool wellFormed = false;
  bool captured = false; // issued during CUDA graph capture
  bool inCoalescingBlock = false;
};

// `input` and `output` as the collective of `kind` takes them (a
// reduce-scatter's input and an all-gather's output hold the N chunks).
inline ChunkedArgs chunkedArgs(
    Collective kind,
    const at::Tensor& input,
    const at::Tensor& output,
    int worldSize,
    c10d::ReduceOp::RedOpType op) {
  const at::Tensor& chunks =
      kind == Collective::kReduceScatter ? input : output;
  const at::Tensor& chunk = kind == Collective::kReduceScatter ? output : input;
  ChunkedArgs args;
  args.kind = kind;
  args.deviceType = input.device().type();
  args.dtype = input.scalar_type();
  args.op = op;
  args.bytes = chunks.numel() * chunks.element_size();
  args.wellFormed = input.layout() == at::kStrided &&
      output.layout() == at::kStrided && input.is_contiguous() &&
      output.is_contiguous() && input.scalar_type() == output.scalar_type() &&
      input.device() == output.device() &&
      chunks.numel() == chunk.numel() * worldSize && chunk.numel() > 0;
  return args;
}

// The engine takes it where it can serve the group and this device, the
// tensors are well formed, the engine reduces the dtype with the op (an
// all-gather reduces nothing, but moves only the dtypes it reduces), and the
// size is at or above the all-reduce's flat threshold. Not in a coalescing
// block, nor under capture: the delegate runs those.
inline bool chunkedOnEngine(
    const ChunkedArgs& args,
    bool servesEngine,
    const Config& config,
    EngineSizes sizes) {
  const bool cpu = args.deviceType == c10::kCPU;
  const auto op =
      args.kind == Collective::kAllGather ? c10d::ReduceOp::SUM : args.op;
  return servesEngine && (cpu || config.cudaEngine) && args.wellFormed &&
      !args.captured && !args.inCoalescingBlock &&
      reductionSupported(args.dtype, op) && args.bytes >= sizes.fromBytes &&
      args.bytes < sizes.belowBytes;
}

} // namespace fairring
