#pragma once

// Whether a reduce-scatter or an all-gather runs on the engine or on the
// delegate, in any of c10d's forms (one tensor each side, coalesced pairs,
// lists): one pure function of its arguments and the group's settings, which
// every rank gives alike (c10d's rule), so every rank decides alike.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "backend/allreduce_path.h"
#include "config.h"
#include "engine/engine.h"
#include "reduction.h"

namespace fairring {

// One pair of a reduce-scatter or an all-gather as c10d gives it: `chunk`,
// a reduce-scatter's output or an all-gather's input (C elements), and
// `chunks`, the other side: one tensor of N x C elements, or (the list forms)
// N tensors shaped as `chunk`, in group-rank order.
struct ChunkedPart {
  at::Tensor chunk;
  std::vector<at::Tensor> chunks;
};

struct ChunkedArgs {
  Collective kind = Collective::kReduceScatter;
  c10::DeviceType deviceType = c10::kCPU;
  at::ScalarType dtype = at::kFloat;
  c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM; // a reduce-scatter's
  int64_t bytes = 0; // of the N-chunk side, all pairs together
  // Every tensor strided, contiguous, of one dtype and one device; every
  // pair's N-chunk side N chunks of C elements (list elements shaped as the
  // chunk), C > 0.
  bool wellFormed = false;
  bool captured = false; // issued during CUDA graph capture
  bool inCoalescingBlock = false;
};

inline ChunkedArgs chunkedArgs(
    Collective kind,
    const std::vector<ChunkedPart>& parts,
    int worldSize,
    c10d::ReduceOp::RedOpType op) {
  ChunkedArgs args;
  args.kind = kind;
  args.op = op;
  if (parts.empty() || !parts[0].chunk.defined()) {
    return args;
  }
  const at::Tensor& first = parts[0].chunk;
  args.deviceType = first.device().type();
  args.dtype = first.scalar_type();
  auto alike = [&](const at::Tensor& t) {
    return t.defined() && t.layout() == at::kStrided && t.is_contiguous() &&
        t.scalar_type() == first.scalar_type() && t.device() == first.device();
  };
  args.wellFormed = true;
  for (const ChunkedPart& part : parts) {
    const int64_t chunkNumel = part.chunk.defined() ? part.chunk.numel() : 0;
    bool partWellFormed = alike(part.chunk) && chunkNumel > 0;
    if (part.chunks.size() == 1) {
      partWellFormed = partWellFormed && alike(part.chunks[0]) &&
          part.chunks[0].numel() == chunkNumel * worldSize;
    } else {
      partWellFormed = partWellFormed &&
          part.chunks.size() == static_cast<size_t>(worldSize);
      for (const at::Tensor& chunk : part.chunks) {
        partWellFormed = partWellFormed && alike(chunk) &&
            chunk.sizes() == part.chunk.sizes();
      }
    }
    args.wellFormed = args.wellFormed && partWellFormed;
    args.bytes += chunkNumel * worldSize * first.element_size();
  }
  return args;
}

// The op the engine reduces: an all-gather reduces nothing (but moves only
// the dtypes the engine reduces: it checks them as a SUM); a PREMUL_SUM of
// floating-point tensors is scaled into a packed copy and reduced as a SUM.
inline c10d::ReduceOp::RedOpType chunkedEngineOp(const ChunkedArgs& args) {
  if (args.kind == Collective::kAllGather) {
    return c10d::ReduceOp::SUM;
  }
  if (args.op == c10d::ReduceOp::PREMUL_SUM && at::isFloatingType(args.dtype)) {
    return c10d::ReduceOp::SUM;
  }
  return args.op;
}

// The engine takes it where it can serve the group and this device, the
// tensors are well formed, the engine reduces the dtype with the op, and the
// size is at or above the all-reduce's flat threshold. Not in a coalescing
// block, nor under capture: the delegate runs those.
inline PathReason chunkedReason(
    const ChunkedArgs& args,
    bool servesEngine,
    const Config& config,
    EngineSizes sizes) {
  if (!servesEngine) {
    return PathReason::kIrregularGroup;
  }
  if (args.captured) {
    return PathReason::kCaptured;
  }
  if (!args.wellFormed) {
    return PathReason::kMixedTensors;
  }
  if (!reductionSupported(args.dtype, chunkedEngineOp(args), args.deviceType)) {
    return PathReason::kDtypeOrOp;
  }
  if (const auto held = sizeAndSettingReason(
          args.deviceType == c10::kCPU, args.bytes, config, sizes);
      held != PathReason::kEngine) {
    return held;
  }
  return args.inCoalescingBlock ? PathReason::kCoalescing : PathReason::kEngine;
}

inline bool chunkedOnEngine(
    const ChunkedArgs& args,
    bool servesEngine,
    const Config& config,
    EngineSizes sizes) {
  return chunkedReason(args, servesEngine, config, sizes) ==
      PathReason::kEngine;
}

} // namespace fairring
