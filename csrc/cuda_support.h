#pragma once

// The seam between the device-independent code and CUDA. Exactly one of
// cuda_support_nccl.cpp (CUDA-enabled build) and cuda_support_none.cpp
// (CPU-only build) is compiled; nothing else includes CUDA or NCCL headers.

#include <chrono>
#include <optional>
#include <string>

#include <c10/core/Stream.h>
#include <tensorpipe/common/buffer.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace tensorpipe {
class Context;
} // namespace tensorpipe

namespace fairring::cuda {

// Whether this extension was compiled with its CUDA path.
bool isBuilt();

// Versions of the CUDA runtime and NCCL headers compiled against, if built.
std::optional<std::string> runtimeVersion();
std::optional<std::string> ncclVersion();

// Whether a CUDA device is usable in this process right now.
bool devicesPresent();

// A NCCL process group over the same ranks, for CUDA tensors. Only call when
// devicesPresent(): constructing a NCCL group without a GPU is not safe.
c10::intrusive_ptr<c10d::Backend> makeNcclBackend(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout);

struct RailsChannels {
  std::string names; // best first, for logs
  // GPUDirect RDMA carries CUDA buffers. TensorPipe's channel for it has
  // crashed on buffers under kGpuDirectMinBytes: callers keep shards larger.
  bool gpuDirect = false;
};
constexpr int64_t kGpuDirectMinBytes = 32;

// Registers the channels that move CUDA buffers between machines: GPUDirect
// RDMA (cuda_gdr) where viable and allowed, else staging through host memory
// (cuda_basic). Never cuda_ipc or cuda_xth: rail peers share no host.
RailsChannels registerRailsChannels(
    tensorpipe::Context& context,
    bool allowGpuDirect);

// A TensorPipe view of device memory at `ptr`, ordered on `stream`: a send
// reads it after the work queued on `stream` so far, a receive makes it
// available to work queued on `stream` after its callback.
tensorpipe::Buffer tensorpipeBuffer(void* ptr, const c10::Stream& stream);

} // namespace fairring::cuda
