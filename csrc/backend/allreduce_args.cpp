#include "backend/allreduce_args.h"

#include <algorithm>

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/cat.h>
#include <c10/util/Exception.h>

#include "backend/work.h"
#include "engine/reduction.h"

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

// Aliases of `tensors` that autograd does not see. fairring's own arithmetic
// on a caller's tensors (PREMUL_SUM's scaling, packing, copies back, the
// engine's steps) runs on threads in grad mode, and the tensors may require
// grad (DDP's buckets under backward(create_graph=True)): through an alias it
// stays arithmetic on memory, as Gloo's is, and records no graph. Sparse
// tensors stay themselves: Gloo writes a sparse result by giving the tensor
// object new indices and values, which an alias would take instead.
std::vector<at::Tensor> withoutAutograd(
    const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> aliases;
  aliases.reserve(tensors.size());
  for (const auto& tensor : tensors) {
    aliases.push_back(
        tensor.layout() == at::kStrided ? tensor.detach() : tensor);
  }
  return aliases;
}

// Gloo, which serves CPU tensors, has no PREMUL_SUM and cannot average
// integers; say so up front instead of failing inside Gloo. (all_reduce turns
// PREMUL_SUM into SUM first: see premultiplied().)
void checkCpuReduction(
    const char* opName,
    const c10d::ReduceOp& op,
    const std::vector<at::Tensor>& tensors) {
  for (const auto& tensor : tensors) {
    const at::ScalarType dtype = tensor.scalar_type();
    // Gloo reduces what the engine does, and bool and complex64/128.
    const bool glooReduces = reducibleDtype(dtype) || dtype == at::kBool ||
        dtype == at::kComplexFloat || dtype == at::kComplexDouble;
    TORCH_CHECK(
        glooReduces,
        "fairring: ",
        opName,
        " of ",
        dtype,
        " CPU tensors is not supported (Gloo reduces float32, float64, "
        "float16, bfloat16, int8, uint8, int32, int64, bool and complex); "
        "convert the tensor first, e.g. to ",
        at::isFloatingType(dtype) ? "float32" : "int64");
  }
  TORCH_CHECK(
      op != c10d::ReduceOp::PREMUL_SUM,
      "fairring: ",
      opName,
      " with ReduceOp.PREMUL_SUM is not supported for CPU tensors (all_reduce "
      "supports it); scale the tensor and use ReduceOp.SUM");
  if (op != c10d::ReduceOp::AVG) {
    return;
  }
  for (const auto& tensor : tensors) {
    TORCH_CHECK(
        at::isFloatingType(tensor.scalar_type()),
        "fairring: ",
        opName,
        " with ReduceOp.AVG needs a floating-point tensor, got ",
        tensor.scalar_type(),
        "; use ReduceOp.SUM and divide by the group size");
  }
}

// PREMUL_SUM is the sum of factor x input over ranks: scaling this rank's
// input by its own factor first, in place (the all-reduce overwrites it
// anyway), turns it into a plain SUM that any path can run.
c10d::AllreduceOptions premultiplied(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  // NCCLPreMulSumSupplement: the name torch 2.11 and 2.15 both have.
  const auto* supplement = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(
      opts.reduceOp.supplement_.get());
  TORCH_CHECK(
      supplement != nullptr,
      "fairring: all_reduce with ReduceOp.PREMUL_SUM needs a factor; build it "
      "with torch.distributed._make_nccl_premul_sum(factor)");
  for (auto& tensor : tensors) {
    TORCH_CHECK(
        at::isFloatingType(tensor.scalar_type()),
        "fairring: all_reduce with ReduceOp.PREMUL_SUM needs a floating-point "
        "tensor, got ",
        tensor.scalar_type());
    if (supplement->tensor_factor.defined()) {
      tensor.mul_(supplement->tensor_factor.to(tensor.device()));
    } else {
      tensor.mul_(supplement->double_factor);
    }
  }
  c10d::AllreduceOptions sum = opts;
  sum.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  return sum;
}

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
    bool coalesced,
    bool nativeBlockOpen) {
  AllreduceArgs args;
  args.op = op.op_;
  args.tensorCount = tensors.size();
  args.packable = coalesced;
  args.canPremultiply = !coalesced;
  args.nativeBlockOpen = nativeBlockOpen;
  if (tensors.empty()) {
    args.uniform = false;
    return args;
  }
  args.deviceType = tensors[0].device().type();
  args.dtype = tensors[0].scalar_type();
  args.bytes = totalBytes(tensors);
  args.uniform =
      std::all_of(tensors.begin(), tensors.end(), [&](const at::Tensor& t) {
        return t.scalar_type() == tensors[0].scalar_type() &&
            t.device() == tensors[0].device() && !t.is_sparse();
      });
  args.ncclMisreadsPremulFactor = ncclMisreadsPremulFactor(tensors, op);
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

// Copies consecutive pieces of the 1-D `packed`, each as long as the next
// tensor, into `tensors`.
void unpackInto(
    const at::Tensor& packed, const std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (const auto& tensor : tensors) {
    tensor.copy_(packed.narrow(0, offset, tensor.numel()).view(tensor.sizes()));
    offset += tensor.numel();
  }
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

// Gloo reads and writes a CPU tensor as if it were contiguous: a view with
// gaps (t[::3], a column slice) would get wrong sums and its gaps
// overwritten. Such tensors go to Gloo as contiguous copies, copied back
// when it is done (on Gloo's thread).
c10::intrusive_ptr<c10d::Work> allreduceDense(
    c10d::Backend& gloo,
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts,
    uint64_t seq) {
  const bool dense =
      std::all_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) {
        return t.layout() != at::kStrided || t.is_contiguous();
      });
  if (dense) {
    return gloo.allreduce(tensors, opts);
  }
  std::vector<at::Tensor> copies;
  copies.reserve(tensors.size());
  for (const auto& tensor : tensors) {
    copies.push_back(
        tensor.layout() == at::kStrided ? tensor.contiguous() : tensor);
  }
  auto work = gloo.allreduce(copies, opts);
  auto copiedBack = work->getFuture()->then(
      [tensors, copies](c10::ivalue::Future& done) {
        done.value(); // rethrows Gloo's error
        for (size_t i = 0; i < tensors.size(); ++i) {
          if (!tensors[i].is_same(copies[i])) {
            tensors[i].copy_(copies[i]);
          }
        }
        return c10::IValue(tensors);
      },
      c10::ListType::create(c10::TensorType::get()));
  return c10::make_intrusive<FutureWork>(
      copiedBack, c10d::OpType::ALLREDUCE, "fairring:all_reduce", seq, tensors);
}

// One engine all-reduce of the tensors packed end to end; the result is
// unpacked into them when it completes (on the engine's all-gather thread).
c10::intrusive_ptr<c10::ivalue::Future> packedAllreduce(
    Engine& engine,
    const std::vector<at::Tensor>& tensors,
    c10d::ReduceOp::RedOpType op,
    std::chrono::milliseconds timeout,
    uint64_t collective) {
  std::vector<at::Tensor> flattened;
  flattened.reserve(tensors.size());
  for (const auto& tensor : tensors) {
    flattened.push_back(tensor.reshape({-1}));
  }
  at::Tensor packed = at::cat(flattened);
  return engine.allreduce(packed, op, timeout, collective)
      ->then(
          [tensors, packed](c10::ivalue::Future& done) {
            done.value(); // rethrows the engine's error into the returned
                          // future
            unpackInto(packed, tensors);
            return c10::IValue(tensors);
          },
          c10::ListType::create(c10::TensorType::get()));
}

} // namespace fairring
