#pragma once

// The CUDA side of the TensorPipe mesh. Exactly one of cuda.cpp
// (CUDA-enabled build) and cuda_none.cpp (CPU-only build) is
// compiled; with device/cuda.cpp, they are the only files that see CUDA
// headers.

#include <string>
#include <vector>

#include <tensorpipe/common/buffer.h>

#include "config.h"
#include "rails/transport.h"

namespace tensorpipe {
class Context;
} // namespace tensorpipe

namespace fairring::rails {

// Registers the channels that move CUDA buffers between machines, those
// `network` allows, best first: GPUDirect RDMA (cuda_gdr) where viable, on
// the InfiniBand devices `network` maps each GPU to, and staging through
// pinned host memory (cuda_basic). Never cuda_ipc or cuda_xth: rail peers
// share no host. Fails if a channel the user required is not viable, or if
// none is. Returns the names registered, best first, for logs.
std::vector<std::string> registerCudaChannels(
    tensorpipe::Context& context, const RailsNetwork& network, int rank);

// TensorPipe's view of CUDA memory, ordered on the buffer's stream.
tensorpipe::Buffer cudaBuffer(const Buffer& buffer);

} // namespace fairring::rails
