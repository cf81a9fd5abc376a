#include <torch_headers.h> // first: the precompiled torch headers

#include "backend/allreduce_args.h"

#include <algorithm>

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include "backend/operation.h"
#include "device/capture.h"
#include "reduction.h"

namespace fairring {

namespace {

int64_t totalBytes(const std::vector<at::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& tensor : tensors) {
    bytes += tensor.numel() * tensor.element_size();
  }
  return bytes;
}

} // namespace

bool ncclMisreadsPremulFactor(
    const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op) {
  const auto* supplement =
      dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  return op == c10d::ReduceOp::PREMUL_SUM && supplement != nullptr &&
      !supplement->tensor_factor.defined() &&
      std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) {
           return t.scalar_type() == at::kBFloat16;
         });
}

AllreduceArgs allreduceArgs(
    const std::vector<at::Tensor>& tensors,
    const c10d::ReduceOp& op,
    AllreduceForm form,
    bool nativeBlockOpen) {
  const bool coalesced = form == AllreduceForm::kCoalesced;
  const char* opName = coalesced ? "allreduce_coalesced" : "allreduce";
  AllreduceArgs args;
  args.deviceType = deviceTypeOf(opName, tensors);
  if (!coalesced) {
    checkNoOverlap(tensors);
  }
  args.signature = reductionSignature(
      coalesced ? "all_reduce_coalesced" : "all_reduce",
      args.deviceType,
      tensors,
      op);
  args.reduceOp = op;
  args.op = op.op_;
  args.tensorCount = tensors.size();
  args.packable = coalesced;
  args.canPremultiply = !coalesced;
  args.nativeBlockOpen = nativeBlockOpen;
  if (tensors.empty()) {
    args.uniform = false;
    return args;
  }
  args.device = tensors[0].device();
  args.dtype = tensors[0].scalar_type();
  args.bytes = totalBytes(tensors);
  args.uniform =
      std::all_of(tensors.begin(), tensors.end(), [&](const at::Tensor& t) {
        return t.scalar_type() == tensors[0].scalar_type() &&
            t.device() == tensors[0].device() && !t.is_sparse();
      });
  args.ncclMisreadsPremulFactor = ncclMisreadsPremulFactor(tensors, op);
  args.captured = graphCaptureUnderway(args.device);
  return args;
}

// The part of a reduction's arguments that every rank must give alike: the
// tensors' total size, their count and dtype, and the op (not a PREMUL_SUM's
// factor, which may differ).
std::string reductionSignature(
    const char* opName,
    c10::DeviceType type,
    const std::vector<at::Tensor>& tensors,
    const c10d::ReduceOp& op) {
  int64_t numel = 0;
  for (const auto& tensor : tensors) {
    numel += tensor.numel();
  }
  std::string signature = std::string(opName) + " " +
      c10::DeviceTypeName(type, /*lower_case=*/true) + " " +
      (tensors.empty() ? std::string("none")
                       : std::string(c10::toString(tensors[0].scalar_type()))) +
      "[" + std::to_string(numel) + "]";
  if (tensors.size() != 1) {
    signature += "x" + std::to_string(tensors.size());
  }
  return signature + " " + reduceOpName(op.op_);
}

// all_reduce writes each element's result in place: elements that share
// memory cannot each hold it.
void checkNoOverlap(const std::vector<at::Tensor>& tensors) {
  for (const auto& tensor : tensors) {
    TORCH_CHECK(
        tensor.layout() != at::kStrided ||
            at::has_internal_overlap(tensor) != at::MemOverlap::Yes,
        "fairring: all_reduce writes its result in place, but elements of "
        "this tensor share memory (an expand()ed or as_strided view, shape ",
        tensor.sizes(),
        ", strides ",
        tensor.strides(),
        "); pass a tensor that owns its elements, e.g. tensor.clone()");
  }
}

} // namespace fairring
