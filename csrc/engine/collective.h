#pragma once

#include <cstddef>

namespace fairring {

// The collectives the engine runs. A reduce-scatter runs an all-reduce's
// steps 1 to 3 (its input's chunks reordered so that the local step leaves
// each rank its machine's partials of its rail's chunks), an all-gather its
// steps 4 and 5 (docs/design.md, "Reduce-scatter and all-gather").
enum class Collective { kAllReduce, kReduceScatter, kAllGather };
constexpr size_t kCollectiveKinds = 3;

constexpr const char* collectiveName(Collective kind) {
  switch (kind) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllGather:
      return "all_gather";
  }
  return "?";
}

} // namespace fairring
