#pragma once

// An all-reduce's arguments taken from its tensors and options into one
// checked value (the door of Backend::allreduce), and the rules of the
// reductions fairring delegates. None of these launches work. Each
// function's contract is at its definition, in allreduce_args.cpp.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "backend/allreduce_path.h"
#include "config.h"

namespace fairring {

// Whether NCCL would get this PREMUL_SUM wrong: ProcessGroupNCCL (measured
// with torch 2.11 and NCCL 2.28) gives NCCL a scalar factor for bfloat16
// tensors that NCCL reads as zero, so every result is 0. fairring
// premultiplies such tensors itself and asks NCCL for a SUM.
bool ncclMisreadsPremulFactor(
    const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op);

enum class AllreduceForm {
  kOne, // all_reduce: one tensor (or c10d's legacy list)
  kCoalesced, // all_reduce_coalesced: several, packed as one
};

// The arguments of an all-reduce of `tensors` with `op` (see AllreduceArgs),
// checked: one device type, and, for all_reduce, no elements sharing memory.
// `nativeBlockOpen`: issued inside a coalescing block.
AllreduceArgs allreduceArgs(
    const std::vector<at::Tensor>& tensors,
    const c10d::ReduceOp& op,
    AllreduceForm form,
    bool nativeBlockOpen);

// What every rank must give alike for this reduction (the ledger compares it).
std::string reductionSignature(
    const char* opName,
    c10::DeviceType type,
    const std::vector<at::Tensor>& tensors,
    const c10d::ReduceOp& op);

// Throws where elements of a tensor share memory: they cannot each hold a
// result written in place.
void checkNoOverlap(const std::vector<at::Tensor>& tensors);

} // namespace fairring
