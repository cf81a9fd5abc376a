#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

namespace fairring {

// What a process holds at one moment, as far as an engine's making can
// change it: its threads, its open descriptors, and the memory in use on a
// device (the whole device's, as CUDA reports it; -1 for the CPU).
struct ProcessCounts {
  int64_t threads = 0;
  int64_t descriptors = 0;
  int64_t deviceBytesInUse = -1;

  static ProcessCounts now(c10::Device device);
};

// What an engine holds, for its owner's report (the group's
// engine_footprint(), and the INFO line when it is made). By the engine's own
// count: its staging, the rails' pinned host memory and its connections. And
// measured: what making it (its local groups, rails, staging, threads and,
// on CUDA, its warm-up) added to the process.
struct EngineFootprint {
  std::string device;
  int64_t stagingBytes = 0; // on `device` (host memory for a CPU engine)
  int64_t pinnedHostBytes =
      0; // the rails' pinned staging (TensorPipe's CUDA pools)
  int64_t connections = 0; // data lanes to rail peers, and control connections
  int64_t addedThreads = 0;
  int64_t addedDescriptors = 0;
  int64_t addedDeviceBytes = -1; // -1: not measured (the CPU)

  // "staging 24.0 MiB on cuda:0, pinned host memory 32.0 MiB, 9 connections;
  // making it added 14 threads, 40 descriptors, 310.5 MiB of cuda:0's memory".
  std::string describe() const;
};

// `after` less `before`, with what the engine counts itself.
EngineFootprint footprintOf(
    c10::Device device,
    int64_t stagingBytes,
    int64_t pinnedHostBytes,
    int64_t connections,
    const ProcessCounts& before,
    const ProcessCounts& after);

} // namespace fairring
