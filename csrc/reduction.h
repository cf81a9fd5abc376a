#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace fairring {

// The engine's arithmetic, in ATen ops that run on the tensors' own device
// (CPU kernels or CUDA kernels on the current stream): the same code serves
// both. float16 and bfloat16 sums accumulate in float32 within reduceRows.

// The dtypes the engine reduces: float32/64, float16, bfloat16, int8, uint8,
// int32, int64.
bool reducibleDtype(at::ScalarType dtype);

// Whether the engine reduces `dtype` with `op` on tensors of `deviceType`:
// SUM, MAX, MIN, PRODUCT on the reducible dtypes; AVG on the floating-point
// ones; BAND, BOR, BXOR on the integer ones, on CPU only (NCCL, the CUDA
// delegate, refuses them, and the engine refuses what its delegate does at
// some size). PREMUL_SUM arrives as SUM: see backend/premul.h.
bool reductionSupported(
    at::ScalarType dtype,
    c10d::ReduceOp::RedOpType op,
    c10::DeviceType deviceType);

// The op's name as Python spells it, lower case ("sum", "premul_sum").
const char* reduceOpName(c10d::ReduceOp::RedOpType op);

// The op the local steps use: AVG sums there and divides once, in reduceRows.
c10d::ReduceOp::RedOpType localReduceOp(c10d::ReduceOp::RedOpType op);

// `into` op= `other`, elementwise and in place.
void combineInto(
    at::Tensor& into, const at::Tensor& other, c10d::ReduceOp::RedOpType op);

// `out` = `a` op `b`, elementwise; `out` may alias neither.
void combineOut(
    at::Tensor& out,
    const at::Tensor& a,
    const at::Tensor& b,
    c10d::ReduceOp::RedOpType op);

// `out` = `rows` reduced over dim 0; AVG divides by `worldSize`.
void reduceRows(
    at::Tensor& out,
    const at::Tensor& rows,
    c10d::ReduceOp::RedOpType op,
    int worldSize);

} // namespace fairring
