#pragma once

// What an all-reduce's arguments must be, and how the backend reshapes them
// for the engine or for Gloo: dtype and op rules, PREMUL_SUM, packing, views
// with gaps. Pure functions of the tensors and options, so that the c10d
// facade (backend.h) only routes. Each function's contract is at its
// definition, in allreduce_args.cpp.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "backend/allreduce_path.h"
#include "config.h"
#include "engine/engine.h"

namespace fairring {

// Aliases of `tensors` that autograd does not see (sparse tensors stay
// themselves).
std::vector<at::Tensor> withoutAutograd(const std::vector<at::Tensor>& tensors);

// Throws, saying what to change, where Gloo cannot run `op` on `tensors`.
void checkCpuReduction(
    const char* opName,
    const c10d::ReduceOp& op,
    const std::vector<at::Tensor>& tensors);

// Scales `tensors` in place by the PREMUL_SUM factor of `opts` and returns
// the options of the plain SUM that remains.
c10d::AllreduceOptions premultiplied(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts);

// Whether NCCL would get this PREMUL_SUM wrong: ProcessGroupNCCL (measured
// with torch 2.11 and NCCL 2.28) gives NCCL a scalar factor for bfloat16
// tensors that NCCL reads as zero, so every result is 0. fairring
// premultiplies such tensors itself and asks NCCL for a SUM.
bool ncclMisreadsPremulFactor(
    const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op);

// The arguments of an all-reduce of `tensors` with `op` (see AllreduceArgs):
// `coalesced` for all_reduce_coalesced.
AllreduceArgs allreduceArgs(
    const std::vector<at::Tensor>& tensors,
    const c10d::ReduceOp& op,
    bool coalesced,
    bool nativeBlockOpen);

// What every rank must give alike for this reduction (the ledger compares it).
std::string reductionSignature(
    const char* opName,
    c10::DeviceType type,
    const std::vector<at::Tensor>& tensors,
    const c10d::ReduceOp& op);

// Copies consecutive pieces of the 1-D `packed`, each as long as the next
// tensor, into `tensors` (the all-reduce's packing, all_to_all's too).
void unpackInto(
    const at::Tensor& packed, const std::vector<at::Tensor>& tensors);

// Throws where elements of a tensor share memory: they cannot each hold a
// result written in place.
void checkNoOverlap(const std::vector<at::Tensor>& tensors);

// Gloo's all-reduce of `tensors`, views with gaps through contiguous copies.
c10::intrusive_ptr<c10d::Work> allreduceDense(
    c10d::Backend& gloo,
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts,
    uint64_t seq);

// One engine all-reduce of `tensors` packed end to end, unpacked into them
// when it completes.
c10::intrusive_ptr<c10::ivalue::Future> packedAllreduce(
    Engine& engine,
    const std::vector<at::Tensor>& tensors,
    c10d::ReduceOp::RedOpType op,
    std::chrono::milliseconds timeout,
    uint64_t collective);

} // namespace fairring
