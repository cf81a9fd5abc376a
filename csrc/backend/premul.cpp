#include <torch_headers.h> // first: the precompiled torch headers

#include "backend/premul.h"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <c10/util/Exception.h>

namespace fairring {

PremulFactor PremulFactor::of(
    const c10d::ReduceOp& op, const char* opName, at::ScalarType dtype) {
  // NCCLPreMulSumSupplement: the name torch 2.11 and 2.15 both have.
  const auto* supplement =
      dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(
      supplement != nullptr,
      "fairring: ",
      opName,
      " with ReduceOp.PREMUL_SUM needs a factor; build it with "
      "torch.distributed._make_nccl_premul_sum(factor)");
  TORCH_CHECK(
      at::isFloatingType(dtype),
      "fairring: ",
      opName,
      " with ReduceOp.PREMUL_SUM needs a floating-point tensor, got ",
      dtype);
  PremulFactor factor;
  factor.tensor_ = supplement->tensor_factor;
  factor.value_ = supplement->double_factor;
  return factor;
}

void PremulFactor::scale(at::Tensor& tensor) const {
  if (tensor_.defined()) {
    tensor.mul_(tensor_.to(tensor.device()));
  } else {
    tensor.mul_(value_);
  }
}

at::Tensor PremulFactor::scaled(const at::Tensor& tensor) const {
  // Into the tensor's own dtype, as scale() writes it: a float64 factor
  // must not promote the copy.
  if (tensor_.defined()) {
    at::Tensor copy = at::empty_like(tensor, at::MemoryFormat::Contiguous);
    at::mul_out(copy, tensor, tensor_.to(tensor.device()));
    return copy;
  }
  return tensor.mul(value_).contiguous();
}

} // namespace fairring
