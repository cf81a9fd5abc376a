#include "engine/footprint.h"

#include <cstdio>
#include <filesystem>
#include <system_error>

#include "device/device.h"

namespace fairring {

namespace {

// Entries of a /proc folder of this process; 0 where it cannot be read.
int64_t entriesOf(const char* folder) {
  std::error_code error;
  int64_t count = 0;
  for (std::filesystem::directory_iterator it(folder, error), end;
       !error && it != end;
       it.increment(error)) {
    ++count;
  }
  return count;
}

std::string mebibytes(int64_t bytes) {
  char text[32];
  std::snprintf(
      text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

} // namespace

ProcessCounts ProcessCounts::now(c10::Device device) {
  ProcessCounts counts;
  counts.threads = entriesOf("/proc/self/task");
  counts.descriptors = entriesOf("/proc/self/fd");
  counts.deviceBytesInUse = device.is_cuda() ? cudaMemoryInUse(device) : -1;
  return counts;
}

EngineFootprint footprintOf(
    c10::Device device,
    int64_t stagingBytes,
    int64_t pinnedHostBytes,
    int64_t connections,
    const ProcessCounts& before,
    const ProcessCounts& after) {
  EngineFootprint footprint;
  footprint.device = device.str();
  footprint.stagingBytes = stagingBytes;
  footprint.pinnedHostBytes = pinnedHostBytes;
  footprint.connections = connections;
  footprint.addedThreads = after.threads - before.threads;
  footprint.addedDescriptors = after.descriptors - before.descriptors;
  if (before.deviceBytesInUse >= 0 && after.deviceBytesInUse >= 0) {
    footprint.addedDeviceBytes =
        after.deviceBytesInUse - before.deviceBytesInUse;
  }
  return footprint;
}

std::string EngineFootprint::describe() const {
  std::string text = "staging " + mebibytes(stagingBytes) + " on " + device +
      ", pinned host memory " + mebibytes(pinnedHostBytes) + ", " +
      std::to_string(connections) + " connections; making it added " +
      std::to_string(addedThreads) + " threads, " +
      std::to_string(addedDescriptors) + " descriptors";
  if (addedDeviceBytes >= 0) {
    text += ", " + mebibytes(addedDeviceBytes) + " of " + device + "'s memory";
  }
  return text;
}

} // namespace fairring
