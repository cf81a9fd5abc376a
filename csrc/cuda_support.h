#pragma once

// The seam between the device-independent code and CUDA. Exactly one of
// cuda_support_nccl.cpp (CUDA-enabled build) and cuda_support_none.cpp
// (CPU-only build) is compiled; nothing else includes CUDA or NCCL headers.

#include <chrono>
#include <optional>
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

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

} // namespace fairring::cuda
