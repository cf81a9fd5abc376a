#pragma once

// The CUDA side of the TensorPipe mesh. Exactly one of tensorpipe_cuda.cpp
// (CUDA-enabled build) and tensorpipe_cuda_none.cpp (CPU-only build) is
// compiled; with device/cuda.cpp, they are the only files that see CUDA
// headers.

#include <string>

#include <tensorpipe/common/buffer.h>

#include "rails/transport.h"

namespace tensorpipe {
class Context;
} // namespace tensorpipe

namespace fairring::rails {

// Registers the channels that move CUDA buffers between machines: GPUDirect
// RDMA (cuda_gdr) where viable and allowed, and staging through pinned host
// memory (cuda_basic) in any case. Never cuda_ipc or cuda_xth: rail peers
// share no host. Returns their names, best first, for logs.
std::string registerCudaChannels(
    tensorpipe::Context& context,
    bool allowGpuDirect);

// TensorPipe's view of CUDA memory, ordered on the buffer's stream.
tensorpipe::Buffer cudaBuffer(const Buffer& buffer);

} // namespace fairring::rails
