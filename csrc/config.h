#pragma once

#include <cstdint>
#include <string>

namespace fairring {

// Engine settings, parsed and validated from the environment in Python
// (fairring/config.py), which documents each one.
struct Config {
  // Upper bound on staging memory per device (FAIRRING_TOTAL_MEMORY).
  int64_t totalMemoryBytes = 50 * 1024 * 1024;
  // Largest slice an all-reduce is cut into (FAIRRING_SLICE_SIZE).
  int64_t sliceSizeBytes = 4 * 1024 * 1024;
  // All-reduces smaller than this go to the delegate (FAIRRING_FLAT_THRESHOLD).
  int64_t flatThresholdBytes = 0;
  // Network interface for the rails (TP_SOCKET_IFNAME); empty: automatic.
  std::string socketInterface;
  // All-reduces of CUDA tensors run on the engine rather than NCCL
  // (FAIRRING_CUDA_ENGINE).
  bool cudaEngine = false;
  // The rails never use InfiniBand, even where viable (FAIRRING_IB_DISABLE).
  bool infinibandDisabled = false;
  // Where each engine writes its Chrome-trace timeline (FAIRRING_TIMELINE);
  // empty: nowhere.
  std::string timelineDirectory;
};

} // namespace fairring
