#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fairring {

// A flat threshold to be measured (FAIRRING_FLAT_THRESHOLD=auto); no
// all-reduce is smaller, so until it is measured every size is at or above it.
constexpr int64_t kMeasuredThreshold = -1;

// How this rank's rails reach their peers, chosen in Python at init, where
// each choice is logged: the interface (fairring/_interfaces.py) and the
// TensorPipe transports and channels (fairring/_transports.py).
struct RailsNetwork {
  // The numeric address the rails listen on, and only on, and its interface.
  std::string listenAddress = "127.0.0.1";
  std::string interfaceName = "lo";
  // The machine's other rails' interfaces and their addresses, best first:
  // where a rail switch may move this rank's rails when its own interface
  // goes down (FAIRRING_RAIL_FAILOVER; rails/failover.h). Empty: no switch.
  std::vector<std::string> spareInterfaces;
  std::vector<std::string> spareAddresses;
  // Every rank keeps what it sends until its rail peer acknowledges it, so
  // that a switch can resend it: with FAIRRING_RAIL_FAILOVER=1 wherever a
  // machine has several rails, spares or not, so both ends of a pair agree
  // (the CPU engine's only: see Engine's constructor).
  bool railFailover = false;
  // TensorPipe transports ("ibv", "uv") and channels for CPU ("basic") and
  // CUDA ("cuda_gdr", "cuda_basic") buffers, best first. uv is always among
  // the transports: every pipe connects over it first.
  std::vector<std::string> transports{"uv"};
  std::vector<std::string> cpuChannels{"basic"};
  std::vector<std::string> cudaChannels{"cuda_basic"};
  // By GPU index, the InfiniBand device cuda_gdr uses for it; empty: the
  // PCI-nearest, TensorPipe's own choice.
  std::vector<std::string> gpuDirectNics;
  // Those of the above the user asked for by name: the mesh fails if
  // TensorPipe finds one not viable, where it would skip an automatic one.
  std::vector<std::string> required;
  // Which transport carries the rails (FAIRRING_RAILS_TRANSPORT):
  // "tensorpipe" or "nixl"; for NIXL, its backend (FAIRRING_NIXL_BACKEND:
  // "UCX" or "LIBFABRIC") and the path of its C API library
  // (fairring/_nixl.py).
  std::string transport = "tensorpipe";
  std::string nixlBackend = "UCX";
  std::string nixlLibrary;
  // FAIRRING_RAILS_SECRET, or empty: what the group's rails key is derived
  // from (rails/auth/rails_key.h). Never logged or published.
  std::string secret;
  // FAIRRING_RAILS_ENCRYPT: the TensorPipe rails seal every message
  // (rails/tensorpipe/pipe_cipher.h).
  bool encrypt = false;

  bool isRequired(std::string_view name) const {
    return std::find(required.begin(), required.end(), name) != required.end();
  }
};

// Engine settings, parsed and validated from the environment in Python
// (fairring/_config.py), which documents each one and is the one home of their
// defaults: Python sets every field, so none has a default here.
struct Config {
  // Upper bound on staging memory per device (FAIRRING_TOTAL_MEMORY).
  int64_t totalMemoryBytes{};
  // Largest slice an all-reduce is cut into (FAIRRING_SLICE_SIZE).
  int64_t sliceSizeBytes{};
  // At most this many full slices in flight (FAIRRING_SLICES_IN_FLIGHT;
  // see engine/plan.h).
  int64_t maxSlicesInFlight{};
  // Slices grow so that shards are at least this long, within the staging
  // memory (FAIRRING_MIN_SHARD_SIZE; see engine/plan.h).
  int64_t minShardBytes{};
  // All-reduces smaller than this go to the delegate (FAIRRING_FLAT_THRESHOLD),
  // by device type: the Herring path's crossover differs. kMeasuredThreshold:
  // measured at the group's first all-reduce the engine could take (=auto).
  int64_t cpuFlatThresholdBytes{};
  int64_t cudaFlatThresholdBytes{};

  int64_t flatThresholdBytes(bool cuda) const {
    return cuda ? cudaFlatThresholdBytes : cpuFlatThresholdBytes;
  }
  RailsNetwork network;
  // All-reduces of CUDA tensors run on the engine rather than NCCL
  // (FAIRRING_CUDA_ENGINE, unless FAIRRING_SERIALIZED_LAUNCHES sends them to
  // NCCL on a GPU that runs kernels in launch order).
  bool cudaEngine = false;
  // The CUDA engine's streams take the greatest priority, as the group's
  // NCCL options ask of NCCL's (is_high_priority_stream).
  bool highPriorityStreams = false;
  // The CUDA engine launches ahead of the network, and wait() on its ops
  // holds the caller's stream on the device, not the host
  // (FAIRRING_CUDA_WAIT=stream; docs/design.md, "The host never waits").
  bool cudaStreamHold = true;
  // Where each engine writes its Chrome-trace timeline (FAIRRING_TIMELINE);
  // empty: nowhere.
  std::string timelineDirectory;
};

} // namespace fairring
