#pragma once

// Why a collective takes its path, named: the engine, or the first of the
// reasons that keep it off. allreduce_path.h and chunked_path.h decide it;
// the group's counters (usage.h) count delegated ops by it; Backend::pathFor
// answers with it (fairring.backend_of(g).path_for).

#include <cstddef>
#include <cstdint>

namespace fairring {

// In the order a user would check them.
enum class PathReason : uint8_t {
  kEngine, // the engine takes it
  kIrregularGroup, // not 2+ machines of equally many ranks
  kCaptured, // issued during CUDA graph capture: NCCL captures its kernels
  kMixedTensors, // tensors not all dense, of one dtype and device
  kDtypeOrOp, // the engine does not reduce this dtype with this op here
  kEngineOff, // fairring.Options(engine=False) or FAIRRING_ENGINE_DISABLE=1
  kCudaEngineOff, // a CUDA tensor, and FAIRRING_CUDA_ENGINE is off
  kBelowThreshold, // below the flat threshold
  kAboveCeiling, // at or above the ceiling auto measured
  kCoalescing, // several tensors at once, in a form the engine does not pack
};
constexpr size_t kPathReasons = 10;

inline const char* pathReasonName(PathReason reason) {
  switch (reason) {
    case PathReason::kEngine:
      return "engine";
    case PathReason::kIrregularGroup:
      return "irregular_group";
    case PathReason::kCaptured:
      return "captured";
    case PathReason::kMixedTensors:
      return "mixed_tensors";
    case PathReason::kDtypeOrOp:
      return "dtype_or_op";
    case PathReason::kEngineOff:
      return "engine_off";
    case PathReason::kCudaEngineOff:
      return "cuda_engine_off";
    case PathReason::kBelowThreshold:
      return "below_threshold";
    case PathReason::kAboveCeiling:
      return "above_ceiling";
    case PathReason::kCoalescing:
      return "coalescing";
  }
  return "unknown";
}

} // namespace fairring
