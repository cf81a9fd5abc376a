#pragma once

// Which path one all-reduce takes, decided once, by one pure function of its
// arguments taken as one value and of the group's settings. Every rank gives
// alike what the decision reads (c10d's rule, which the ledger checks), so
// every rank decides alike. tests/test_allreduce_path.py checks it by table,
// without processes.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "backend/path_reason.h"
#include "config.h"
#include "reduction.h"

namespace fairring {

// An all-reduce's arguments, as the decision reads them (allreduceArgs()
// in allreduce_args.h takes them from the tensors and options).
struct AllreduceArgs {
  c10::DeviceType deviceType = c10::kCPU;
  c10::Device device = c10::kCPU; // the first tensor's
  // The op with its PREMUL_SUM factor, and what the ledger compares.
  c10d::ReduceOp reduceOp;
  std::string signature;
  at::ScalarType dtype = at::kFloat;
  c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM;
  int64_t bytes = 0; // of every tensor together
  size_t tensorCount = 1;
  // Every tensor dense, of one dtype and one device.
  bool uniform = true;
  // all_reduce_coalesced: several tensors travel packed as one. A plain
  // all_reduce of several tensors is c10d's legacy form: the delegate's.
  bool packable = false;
  // A PREMUL_SUM may be premultiplied here and become a SUM (all_reduce);
  // all_reduce_coalesced leaves it to the delegate.
  bool canPremultiply = false;
  // ProcessGroupNCCL would hand NCCL a bfloat16 factor it reads as zero.
  bool ncclMisreadsPremulFactor = false;
  // Inside a native coalescing block, whose launch may not follow this
  // thread's stream: NCCL keeps its own PREMUL_SUM there.
  bool nativeBlockOpen = false;
  // Issued while the caller's stream is captured into a CUDA graph
  // (device/capture.h): the engine waits on the host, which a graph cannot
  // hold, so NCCL, which captures its own kernels, runs it.
  bool captured = false;
};

// The sizes the engine takes where it could: from the flat threshold up to,
// not including, a ceiling, which only FAIRRING_FLAT_THRESHOLD=auto sets
// (where it measured the engine slower above some size).
struct EngineSizes {
  int64_t fromBytes = 0;
  int64_t belowBytes = std::numeric_limits<int64_t>::max();
};

enum class AllreducePath {
  kEngine, // the Herring engine
  // The engine could, but at this size the delegate is faster: below the
  // flat threshold, or from auto's ceiling up.
  kDelegateBelowThreshold,
  kDelegate, // the delegate: the engine cannot, or is not asked to
};

// What keeps a collective of `bytes` off the engine, if anything, once it is
// known to be one the engine could reduce (`engineCan`'s parts first).
inline PathReason sizeAndSettingReason(
    bool cpu, int64_t bytes, const Config& config, EngineSizes sizes) {
  if (sizes.fromBytes == std::numeric_limits<int64_t>::max()) {
    return PathReason::kEngineOff;
  }
  if (!cpu && !config.cudaEngine) {
    return PathReason::kCudaEngineOff;
  }
  if (bytes < sizes.fromBytes) {
    return PathReason::kBelowThreshold;
  }
  if (bytes >= sizes.belowBytes) {
    return PathReason::kAboveCeiling;
  }
  return PathReason::kEngine;
}

struct AllreduceRoute {
  AllreducePath path;
  // Scale by the PREMUL_SUM factor here and reduce a SUM.
  bool premultiplyHere;
  PathReason reason = PathReason::kEngine;
};

// `servesEngine`: the group spans 2+ machines of equally many ranks.
// `sizes`: those of the args' device type, which may differ from the
// config's threshold (FAIRRING_FLAT_THRESHOLD=auto measures them).
inline AllreduceRoute chooseAllreducePath(
    const AllreduceArgs& args,
    bool servesEngine,
    const Config& config,
    EngineSizes sizes) {
  const bool cpu = args.deviceType == c10::kCPU;
  const bool premul = args.op == c10d::ReduceOp::PREMUL_SUM;
  // A premultiplied PREMUL_SUM is the SUM it becomes.
  const auto reduced =
      premul && args.canPremultiply ? c10d::ReduceOp::SUM : args.op;
  const bool engineCan = servesEngine && args.uniform && !args.captured &&
      reductionSupported(args.dtype, reduced, args.deviceType);
  AllreducePath path = AllreducePath::kDelegate;
  if (engineCan &&
      (args.bytes < sizes.fromBytes || args.bytes >= sizes.belowBytes)) {
    path = AllreducePath::kDelegateBelowThreshold;
  } else if (
      engineCan && (cpu || config.cudaEngine) &&
      (args.tensorCount == 1 || args.packable)) {
    path = AllreducePath::kEngine;
  }
  const bool premultiplyHere = premul && args.canPremultiply &&
      (cpu || path == AllreducePath::kEngine ||
       (args.ncclMisreadsPremulFactor && !args.nativeBlockOpen));
  PathReason reason = PathReason::kEngine;
  if (!servesEngine) {
    reason = PathReason::kIrregularGroup;
  } else if (args.captured) {
    reason = PathReason::kCaptured;
  } else if (!args.uniform) {
    reason = PathReason::kMixedTensors;
  } else if (!reductionSupported(args.dtype, reduced, args.deviceType)) {
    reason = PathReason::kDtypeOrOp;
  } else if (const auto held =
                 sizeAndSettingReason(cpu, args.bytes, config, sizes);
             held != PathReason::kEngine) {
    reason = held;
  } else if (path != AllreducePath::kEngine) {
    reason = PathReason::kCoalescing;
  }
  return {path, premultiplyHere, reason};
}

} // namespace fairring
