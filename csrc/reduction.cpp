#include <torch_headers.h> // first: the precompiled torch headers

#include "reduction.h"

#include <ATen/ops/add.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/amin.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_or.h>
#include <ATen/ops/bitwise_xor.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/prod.h>
#include <ATen/ops/sum.h>
#include <c10/util/Exception.h>

namespace fairring {

const char* reduceOpName(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      return "sum";
    case c10d::ReduceOp::AVG:
      return "avg";
    case c10d::ReduceOp::PRODUCT:
      return "product";
    case c10d::ReduceOp::MIN:
      return "min";
    case c10d::ReduceOp::MAX:
      return "max";
    case c10d::ReduceOp::BAND:
      return "band";
    case c10d::ReduceOp::BOR:
      return "bor";
    case c10d::ReduceOp::BXOR:
      return "bxor";
    case c10d::ReduceOp::PREMUL_SUM:
      return "premul_sum";
    case c10d::ReduceOp::UNUSED:
      break;
  }
  return "unknown";
}

bool reducibleDtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

bool reductionSupported(
    at::ScalarType dtype,
    c10d::ReduceOp::RedOpType op,
    c10::DeviceType deviceType) {
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::MAX:
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::PRODUCT:
      break;
    case c10d::ReduceOp::AVG:
      if (!at::isFloatingType(dtype)) {
        return false;
      }
      break;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      if (!at::isIntegralType(dtype, /*includeBool=*/false) ||
          deviceType != c10::kCPU) {
        return false;
      }
      break;
    default:
      return false;
  }
  return reducibleDtype(dtype);
}

c10d::ReduceOp::RedOpType localReduceOp(c10d::ReduceOp::RedOpType op) {
  return op == c10d::ReduceOp::AVG ? c10d::ReduceOp::SUM : op;
}

void combineInto(
    at::Tensor& into, const at::Tensor& other, c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      into.add_(other);
      break;
    case c10d::ReduceOp::MAX:
      at::maximum_out(into, into, other);
      break;
    case c10d::ReduceOp::MIN:
      at::minimum_out(into, into, other);
      break;
    case c10d::ReduceOp::PRODUCT:
      into.mul_(other);
      break;
    case c10d::ReduceOp::BAND:
      into.bitwise_and_(other);
      break;
    case c10d::ReduceOp::BOR:
      into.bitwise_or_(other);
      break;
    case c10d::ReduceOp::BXOR:
      into.bitwise_xor_(other);
      break;
    default:
      TORCH_CHECK(false, "unexpected local reduce op ", op);
  }
}

void combineOut(
    at::Tensor& out,
    const at::Tensor& a,
    const at::Tensor& b,
    c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      at::add_out(out, a, b);
      break;
    case c10d::ReduceOp::MAX:
      at::maximum_out(out, a, b);
      break;
    case c10d::ReduceOp::MIN:
      at::minimum_out(out, a, b);
      break;
    case c10d::ReduceOp::PRODUCT:
      at::mul_out(out, a, b);
      break;
    case c10d::ReduceOp::BAND:
      at::bitwise_and_out(out, a, b);
      break;
    case c10d::ReduceOp::BOR:
      at::bitwise_or_out(out, a, b);
      break;
    case c10d::ReduceOp::BXOR:
      at::bitwise_xor_out(out, a, b);
      break;
    default:
      TORCH_CHECK(false, "unexpected local reduce op ", op);
  }
}

void reduceRows(
    at::Tensor& out,
    const at::Tensor& rows,
    c10d::ReduceOp::RedOpType op,
    int worldSize) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      at::sum_out(out, rows, 0);
      break;
    case c10d::ReduceOp::AVG:
      at::sum_out(out, rows, 0);
      out.div_(worldSize);
      break;
    case c10d::ReduceOp::MAX:
      at::amax_out(out, rows, 0);
      break;
    case c10d::ReduceOp::MIN:
      at::amin_out(out, rows, 0);
      break;
    case c10d::ReduceOp::PRODUCT:
      at::prod_out(out, rows, 0);
      break;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      // ATen has no bitwise reduction over a dimension: fold the rows.
      out.copy_(rows[0]);
      for (int64_t row = 1; row < rows.size(0); ++row) {
        combineInto(out, rows[row], op);
      }
      break;
    default:
      TORCH_CHECK(false, "unexpected reduce op ", op);
  }
}

} // namespace fairring
