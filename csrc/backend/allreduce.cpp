#include <torch_headers.h> // first: the precompiled torch headers

// The all-reduce, in the order it happens: its arguments checked into one
// value (allreduce_args.h), the path chosen (allreduce_path.h), then the
// funnel, whose launch starts the engine or the delegate.

#include "backend/backend.h"

#include <algorithm>

#include <ATen/ops/cat.h>

#include "backend/allreduce_args.h"
#include "backend/chunked_pack.h"
#include "backend/premul.h"
#include "backend/work.h"

namespace fairring {

AllreduceRoute Backend::choosePath(const AllreduceArgs& args) {
  const AllreduceRoute route = chooseAllreducePath(
      args, topology_.servesEngine(), config_, engineSizesFor(args));
  noteIfCapturedGoesToNccl(args.captured, args.deviceType);
  return route;
}

Backend::PathAnswer Backend::pathFor(
    Collective kind,
    int64_t bytes,
    at::ScalarType dtype,
    c10::Device device) const {
  // torch.distributed hands a backend complex tensors viewed as real.
  dtype = c10::toRealValueType(dtype);
  EngineSizes sizes = engineSizesInForce(device.type(), kind);
  const bool measured = sizes.fromBytes != kMeasuredThreshold;
  if (!measured) {
    sizes = EngineSizes{}; // whether the engine could take it at all
  }
  PathReason reason = PathReason::kEngine;
  if (kind == Collective::kAllReduce) {
    AllreduceArgs args;
    args.deviceType = device.type();
    args.device = device;
    args.dtype = dtype;
    args.bytes = bytes;
    reason = chooseAllreducePath(args, topology_.servesEngine(), config_, sizes)
                 .reason;
  } else {
    ChunkedArgs args;
    args.kind = kind;
    args.deviceType = device.type();
    args.dtype = dtype;
    args.bytes = bytes;
    args.wellFormed = true;
    reason = chunkedReason(args, topology_.servesEngine(), config_, sizes);
  }
  const bool engine = reason == PathReason::kEngine;
  return {engine && measured, measured || !engine, reason};
}

void Backend::noteIfCapturedGoesToNccl(
    bool captured, c10::DeviceType deviceType) {
  static std::atomic<bool> noted{false}; // once per process, for every kind
  if (captured && deviceType == c10::kCUDA && config_.cudaEngine &&
      topology_.servesEngine() && !noted.exchange(true)) {
    innerGroups_->noticeOnce(
        "CUDA all-reduces, reduce-scatters and all-gathers issued during CUDA "
        "graph capture go to NCCL, which captures its own kernels: the engine "
        "waits on the host, which a graph cannot hold");
  }
}

namespace {

// fairring's own Work, which completes with `future` (an engine op, or a
// Gloo op whose result is copied or unpacked afterwards).
c10::intrusive_ptr<c10d::Work> futureWork(
    c10::intrusive_ptr<c10::ivalue::Future> future,
    c10d::OpType opType,
    const char* profilingName,
    uint64_t seq,
    const std::vector<at::Tensor>& tensors) {
  return c10::make_intrusive<FutureWork>(
      std::move(future), opType, profilingName, seq, tensors);
}

// A PREMUL_SUM all-reduce scaled here, in place (the all-reduce overwrites
// its tensors anyway): returns the options of the SUM it becomes.
c10d::AllreduceOptions premultiplied(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  for (auto& tensor : tensors) {
    PremulFactor::of(opts.reduceOp, "all_reduce", tensor.scalar_type())
        .scale(tensor);
  }
  c10d::AllreduceOptions sum = opts;
  sum.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  return sum;
}

// Gloo reads and writes a CPU tensor as if it were contiguous: a view with
// gaps (t[::3], a column slice) would get wrong sums and its gaps
// overwritten. Such tensors go to Gloo as contiguous copies, copied back
// when it is done (on Gloo's thread).
c10::intrusive_ptr<c10d::Work> glooAllreduce(
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
  return futureWork(
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
  // Unpacked on the host once done: no hold can wait for that.
  return engine.allreduce(packed, op, timeout, collective)
      .future->then(
          [tensors, packed](c10::ivalue::Future& done) {
            done.value(); // rethrows the engine's error
            unpackInto(packed, tensors);
            return c10::IValue(tensors);
          },
          c10::ListType::create(c10::TensorType::get()));
}

} // namespace

Operation Backend::allreduceOperation(
    const char* name,
    const AllreduceArgs& args,
    const AllreduceRoute& route,
    const std::vector<at::Tensor>& tensors) {
  if (route.path == AllreducePath::kDelegateBelowThreshold) {
    ++belowThreshold_[indexOfType(args.deviceType)];
  }
  return Operation{
      .name = name,
      .type = args.deviceType,
      .signature = args.signature,
      .touches = tensors,
      .reduceOp = route.premultiplyHere ? c10d::ReduceOp(c10d::ReduceOp::SUM)
                                        : args.reduceOp,
      .reduced = tensors,
      .engineDevice = route.path == AllreducePath::kEngine
          ? std::optional(args.device)
          : std::nullopt,
      // Its launch copies what it needs: all_reduce's own (the coalesced
      // form keeps its caller's arguments, and waits).
      .launchesInTurn = std::string_view(name) == "allreduce",
      .captured = args.captured};
}

// One all-reduce, in the order it happens: its arguments checked into one
// value, the path chosen from them, then the funnel, whose launch scales a
// PREMUL_SUM here where the path says so (the tensors are free to write by
// then: memory order was awaited) and starts the engine or the delegate.
c10::intrusive_ptr<c10d::Work> Backend::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  const AllreduceArgs args = allreduceArgs(
      tensors, opts.reduceOp, AllreduceForm::kOne, coalescingBlockOpen());
  const AllreduceRoute route = choosePath(args);
  return issue(
      allreduceOperation("allreduce", args, route, tensors)
          .countedAs(Collective::kAllReduce, args.bytes, route.reason),
      [&](const Runner& runner) {
        return launchAllreduce(runner, tensors, opts, route);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::launchAllreduce(
    const Runner& runner,
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts,
    const AllreduceRoute& route) {
  std::vector<at::Tensor> aliases = withoutAutograd(tensors);
  const c10d::AllreduceOptions own =
      route.premultiplyHere ? premultiplied(aliases, opts) : opts;
  if (runner.engine != nullptr) {
    auto started = runner.engine->allreduce(
        aliases[0], own.reduceOp, timeoutOf(opts.timeout), *runner.seq);
    return c10::make_intrusive<FutureWork>(
        std::move(started.future),
        c10d::OpType::ALLREDUCE,
        "fairring:all_reduce",
        *runner.seq,
        tensors,
        std::move(started.holdCaller));
  }
  auto onDelegate = [delegate = runner.delegate,
                     gloo = isCpu(*runner.delegate),
                     tensors,
                     aliases,
                     own,
                     seq = *runner.seq]() mutable {
    return gloo ? glooAllreduce(*delegate, aliases, askingForWork(own), seq)
                : delegate->allreduce(tensors, askingForWork(own));
  };
  if (runner.inTurn == nullptr) {
    return onDelegate();
  }
  return launchedInTurn(
      *runner.inTurn,
      std::move(onDelegate),
      c10d::OpType::ALLREDUCE,
      tensors,
      *runner.seq);
}

// all_reduce_coalesced: the same, its tensors packed into one on the engine.
c10::intrusive_ptr<c10d::Work> Backend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  const AllreduceArgs args = allreduceArgs(
      tensors, opts.reduceOp, AllreduceForm::kCoalesced, coalescingBlockOpen());
  const AllreduceRoute route = choosePath(args);
  return issue(
      allreduceOperation("allreduce_coalesced", args, route, tensors)
          .countedAs(Collective::kAllReduce, args.bytes, route.reason),
      [&](const Runner& runner) {
        if (runner.engine != nullptr) {
          return futureWork(
              packedAllreduce(
                  *runner.engine,
                  withoutAutograd(tensors),
                  opts.reduceOp,
                  timeoutOf(opts.timeout),
                  *runner.seq),
              c10d::OpType::ALLREDUCE_COALESCED,
              "fairring:all_reduce_coalesced",
              *runner.seq,
              tensors);
        }
        return runner.delegate->allreduce_coalesced(
            tensors, askingForWork(opts));
      });
}

} // namespace fairring
