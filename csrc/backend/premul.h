#pragma once

// ReduceOp.PREMUL_SUM (torch.distributed._make_nccl_premul_sum): the sum over
// ranks of factor x input. Scaling this rank's input by its own factor first
// turns it into a plain SUM, which the engine and Gloo run; NCCL, the CUDA
// delegate, takes the factor itself.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace fairring {

class PremulFactor {
 public:
  // The factor of `op`, a PREMUL_SUM of `dtype` tensors, for the collective
  // named `opName`. Throws, saying what to change, where `op` carries no
  // factor or `dtype` is not floating point.
  static PremulFactor of(
      const c10d::ReduceOp& op, const char* opName, at::ScalarType dtype);

  void scale(at::Tensor& tensor) const; // in place
  at::Tensor scaled(const at::Tensor& tensor) const; // a scaled copy

 private:
  at::Tensor tensor_; // a tensor factor, where it is one
  double value_ = 1.0; // else this
};

} // namespace fairring
