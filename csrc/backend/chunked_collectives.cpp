#include <torch_headers.h> // first: the precompiled torch headers

// The reduce-scatters and all-gathers, in all of c10d's forms: each turned
// into pairs (backend/chunked_path.h), routed once, and run as one engine op
// (backend/chunked_pack.h) or handed to the delegate as it was given.

#include "backend/backend.h"

#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "backend/allreduce_args.h"
#include "backend/chunked_pack.h"
#include "backend/chunked_path.h"
#include "backend/delegated.h"
#include "backend/premul.h"
#include "backend/work.h"
#include "device/capture.h"

namespace fairring {

namespace {

// The op types of the coalesced forms, which torch 2.11 lacks (its
// ProcessGroupNCCL reports them as COALESCED, as these do there).
template <typename Type, typename = void>
struct HasCoalescedOpTypes : std::false_type {};
template <typename Type>
struct HasCoalescedOpTypes<
    Type,
    std::void_t<
        decltype(Type::REDUCE_SCATTER_TENSOR_COALESCED),
        decltype(Type::ALLGATHER_INTO_TENSOR_COALESCED)>> : std::true_type {};

template <typename Type = c10d::OpType>
constexpr Type coalescedOpType(Collective kind) {
  if constexpr (HasCoalescedOpTypes<Type>::value) {
    return kind == Collective::kReduceScatter
        ? Type::REDUCE_SCATTER_TENSOR_COALESCED
        : Type::ALLGATHER_INTO_TENSOR_COALESCED;
  } else {
    return Type::COALESCED;
  }
}

// Whether a PREMUL_SUM reduce-scatter goes to the delegate as a SUM of
// scaled copies: Gloo has no PREMUL_SUM (all_reduce's CPU rule too), and
// NCCL would read a float factor of bfloat16 tensors as zero
// (allreduce_args.h) outside a native coalescing block, which launches later
// on streams of its own.
bool delegatePremultiplies(
    const ChunkedArgs& args,
    const std::vector<at::Tensor>& inputs,
    const c10d::ReduceOp& op) {
  return args.deviceType == c10::kCPU ||
      (ncclMisreadsPremulFactor(inputs, op) && !args.inCoalescingBlock);
}

c10d::ReduceScatterOptions summing(c10d::ReduceScatterOptions opts) {
  opts.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  return opts;
}

std::vector<at::Tensor> scaledCopies(
    const std::vector<at::Tensor>& tensors, const PremulFactor& premul) {
  std::vector<at::Tensor> copies;
  copies.reserve(tensors.size());
  for (const at::Tensor& tensor : tensors) {
    copies.push_back(premul.scaled(tensor.detach()));
  }
  return copies;
}

// Pairs of whole tensors: a reduce-scatter's (output, input) or an
// all-gather's (input, output), index by index.
std::vector<ChunkedPart> tensorPairs(
    const std::vector<at::Tensor>& chunk,
    const std::vector<at::Tensor>& chunks) {
  std::vector<ChunkedPart> parts;
  if (chunk.size() != chunks.size()) {
    return parts; // ill formed: the delegate says what is wrong
  }
  for (size_t i = 0; i < chunk.size(); ++i) {
    parts.push_back({chunk[i].detach(), {chunks[i].detach()}});
  }
  return parts;
}

// The list forms' one pair: one tensor against a list of N.
std::vector<ChunkedPart> listPair(
    const std::vector<at::Tensor>& chunk,
    const std::vector<std::vector<at::Tensor>>& chunkLists) {
  if (chunk.size() != 1 || chunkLists.size() != 1) {
    return {}; // several tensors per process: the delegate's to refuse
  }
  return {{chunk[0].detach(), withoutAutograd(chunkLists[0])}};
}

} // namespace

// On the engine where chunkedOnEngine says so (the group's layout adopted
// first), else through `onDelegate(runner, premul)`, which scales its inputs
// by `premul` where that is set and hands the delegate a SUM.
template <typename OnDelegate>
c10::intrusive_ptr<c10d::Work> Backend::chunked(
    ChunkedCall call, OnDelegate&& onDelegate) {
  ChunkedArgs args = chunkedArgs(
      call.kind, call.parts, topology_.worldSize(), call.reduceOp.op_);
  // Asked once, of the device the funnel would ask about.
  call.op.captured = graphCaptureUnderway(deviceOf(call.op));
  args.captured = *call.op.captured;
  noteIfCapturedGoesToNccl(args.captured, args.deviceType);
  args.inCoalescingBlock = coalescingBlockOpen();
  // FAIRRING_FLAT_THRESHOLD=auto measures this kind here, at its first use
  // the engine could take.
  EngineSizes sizes = engineSizesFor(args, deviceOf(call.op));
  if (sizes.fromBytes == kMeasuredThreshold) {
    // Not measured: the engine could not take it at any size, which the
    // reason then names.
    sizes = EngineSizes{};
  }
  const PathReason reason =
      chunkedReason(args, topology_.servesEngine(), config_, sizes);
  const bool onEngine = reason == PathReason::kEngine;
  call.op = std::move(call.op).countedAs(call.kind, args.bytes, reason);
  return launchChunked(
      args, onEngine, std::move(call), std::forward<OnDelegate>(onDelegate));
}

template <typename OnDelegate>
c10::intrusive_ptr<c10d::Work> Backend::launchChunked(
    const ChunkedArgs& args,
    bool onEngine,
    ChunkedCall call,
    OnDelegate&& onDelegate) {
  std::optional<PremulFactor> premul;
  if (call.kind == Collective::kReduceScatter &&
      call.reduceOp == c10d::ReduceOp::PREMUL_SUM &&
      (onEngine || delegatePremultiplies(args, call.inputs, call.reduceOp))) {
    premul = PremulFactor::of(call.reduceOp, call.op.name, args.dtype);
    call.op.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  }
  if (onEngine) {
    call.op.engineDevice = call.parts[0].chunk.device();
  }
  return issue(
      std::move(call.op),
      [&](const Runner& runner) -> c10::intrusive_ptr<c10d::Work> {
        if (runner.engine == nullptr) {
          return onDelegate(runner, premul);
        }
        if (!runner.engine->knowsLayout()) {
          runner.engine->adoptLayout(groupLayout());
        }
        auto packed = std::make_shared<const PackedChunks>(
            call.kind, std::move(call.parts), topology_.worldSize(), premul);
        auto started = call.kind == Collective::kReduceScatter
            ? runner.engine->reduceScatter(
                  packed->input(),
                  packed->output(),
                  chunkedEngineOp(args),
                  call.timeout,
                  *runner.seq)
            : runner.engine->allGather(
                  packed->input(), packed->output(), call.timeout, *runner.seq);
        auto future = std::move(started.future);
        CallerHold holdCaller = std::move(started.holdCaller);
        if (packed->unpacks()) {
          holdCaller = nullptr; // unpacked on the host once done
          future = future->then(
              [packed](c10::ivalue::Future& done) {
                done.value(); // rethrows the engine's error
                packed->unpack();
                return c10::IValue(packed->callerOutputs());
              },
              c10::ListType::create(c10::TensorType::get()));
        }
        return c10::make_intrusive<FutureWork>(
            std::move(future),
            call.opType,
            call.profilingName,
            *runner.seq,
            packed->callerOutputs(),
            std::move(holdCaller));
      });
}

void Backend::chunkedOnPath(
    Collective kind, at::Tensor& output, at::Tensor& input, bool onEngine) {
  const bool scatters = kind == Collective::kReduceScatter;
  const char* name = scatters ? "reduce_scatter_single" : "all_gather_single";
  std::vector<ChunkedPart> parts = scatters ? tensorPairs({output}, {input})
                                            : tensorPairs({input}, {output});
  const ChunkedArgs args =
      chunkedArgs(kind, parts, topology_.worldSize(), c10d::ReduceOp::SUM);
  TORCH_CHECK(
      !onEngine || chunkedOnEngine(args, topology_.servesEngine(), config_, {}),
      "fairring: the engine cannot take this ",
      name);
  Operation op = Operation::collective(name, output, input);
  op.captured = false;
  if (scatters) {
    op = std::move(op).reducing(c10d::ReduceOp::SUM, {output});
  }
  launchChunked(
      args,
      onEngine,
      {.kind = kind,
       .opType = scatters ? c10d::OpType::_REDUCE_SCATTER_BASE
                          : c10d::OpType::_ALLGATHER_BASE,
       .profilingName = scatters ? "fairring:reduce_scatter_tensor"
                                 : "fairring:all_gather_into_tensor",
       .op = std::move(op),
       .parts = std::move(parts),
       .inputs = {input},
       .reduceOp = c10d::ReduceOp::SUM,
       .timeout = timeout()},
      [&](const Runner& runner, const std::optional<PremulFactor>& /*none*/) {
        return scatters ? runner.delegate->_reduce_scatter_base(
                              output, input, c10d::ReduceScatterOptions{})
                        : runner.delegate->_allgather_base(
                              output, input, c10d::AllgatherOptions{});
      })
      ->wait();
}

std::vector<std::vector<int>> Backend::groupLayout() {
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    if (layout_) {
      return *layout_;
    }
  }
  auto layout = innerGroups_->layout(); // collective: outside the lock
  std::lock_guard<std::mutex> lock(stateMutex_);
  layout_ = layout;
  return layout;
}

c10::intrusive_ptr<c10d::Work> Backend::_reduce_scatter_base(
    at::Tensor& output,
    at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
  return chunked(
      {.kind = Collective::kReduceScatter,
       .opType = c10d::OpType::_REDUCE_SCATTER_BASE,
       .profilingName = "fairring:reduce_scatter_tensor",
       .op = Operation::collective("reduce_scatter_single", output, input)
                 .reducing(opts.reduceOp, {output})
                 .inTurn(),
       .parts = tensorPairs({output}, {input}),
       .inputs = {input},
       .reduceOp = opts.reduceOp,
       .timeout = timeoutOf(opts.timeout)},
      [&](const Runner& runner, const std::optional<PremulFactor>& premul) {
        // Scaled here, on the caller's stream, before the launch's turn.
        return launchDelegated(
            runner,
            c10d::OpType::_REDUCE_SCATTER_BASE,
            {output},
            [delegate = runner.delegate,
             output,
             input = premul ? premul->scaled(input.detach()) : input,
             opts = askingForWork(premul ? summing(opts) : opts)]() mutable {
              return delegate->_reduce_scatter_base(output, input, opts);
            });
      });
}

c10::intrusive_ptr<c10d::Work> Backend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return chunked(
      {.kind = Collective::kReduceScatter,
       .opType = coalescedOpType(Collective::kReduceScatter),
       .profilingName = "fairring:reduce_scatter_tensor_coalesced",
       .op = Operation::collective(
                 "reduce_scatter_single_coalesced", outputs, inputs)
                 .reducing(opts.reduceOp, outputs)
                 .inTurn(),
       .parts = tensorPairs(outputs, inputs),
       .inputs = inputs,
       .reduceOp = opts.reduceOp,
       .timeout = timeoutOf(opts.timeout)},
      [&](const Runner& runner, const std::optional<PremulFactor>& premul) {
        return launchDelegated(
            runner,
            coalescedOpType(Collective::kReduceScatter),
            outputs,
            [delegate = runner.delegate,
             outputs,
             inputs = premul ? scaledCopies(inputs, *premul) : inputs,
             opts = askingForWork(premul ? summing(opts) : opts)]() mutable {
              return delegate->reduce_scatter_tensor_coalesced(
                  outputs, inputs, opts);
            });
      });
}

c10::intrusive_ptr<c10d::Work> Backend::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const std::vector<at::Tensor> read =
      inputs.empty() ? std::vector<at::Tensor>{} : inputs[0];
  return chunked(
      {.kind = Collective::kReduceScatter,
       .opType = c10d::OpType::REDUCE_SCATTER,
       .profilingName = "fairring:reduce_scatter",
       .op = Operation::collective("reduce_scatter", outputs, inputs)
                 .reducing(opts.reduceOp, outputs)
                 .inTurn(),
       .parts = listPair(outputs, inputs),
       .inputs = read,
       .reduceOp = opts.reduceOp,
       .timeout = timeoutOf(opts.timeout)},
      [&](const Runner& runner, const std::optional<PremulFactor>& premul) {
        std::vector<std::vector<at::Tensor>> scaled = inputs;
        if (premul) {
          for (auto& list : scaled) {
            list = scaledCopies(list, *premul);
          }
        }
        return launchDelegated(
            runner,
            c10d::OpType::REDUCE_SCATTER,
            outputs,
            [delegate = runner.delegate,
             outputs,
             inputs = std::move(scaled),
             opts = askingForWork(premul ? summing(opts) : opts)]() mutable {
              return delegate->reduce_scatter(outputs, inputs, opts);
            });
      });
}

// An all-gather's delegate is never handed a scaled copy: it reduces nothing.
c10::intrusive_ptr<c10d::Work> Backend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return chunked(
      {.kind = Collective::kAllGather,
       .opType = c10d::OpType::_ALLGATHER_BASE,
       .profilingName = "fairring:all_gather_into_tensor",
       .op = Operation::collective("all_gather_single", output, input).inTurn(),
       .parts = tensorPairs({input}, {output}),
       .inputs = {input},
       .reduceOp = c10d::ReduceOp::SUM,
       .timeout = timeoutOf(opts.timeout)},
      [&](const Runner& runner, const std::optional<PremulFactor>& /*none*/) {
        return launchDelegated(
            runner,
            c10d::OpType::_ALLGATHER_BASE,
            {output},
            [delegate = runner.delegate,
             output,
             input,
             opts = askingForWork(opts)]() mutable {
              return delegate->_allgather_base(output, input, opts);
            });
      });
}

c10::intrusive_ptr<c10d::Work> Backend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return chunked(
      {.kind = Collective::kAllGather,
       .opType = coalescedOpType(Collective::kAllGather),
       .profilingName = "fairring:all_gather_into_tensor_coalesced",
       .op =
           Operation::collective("all_gather_single_coalesced", outputs, inputs)
               .inTurn(),
       .parts = tensorPairs(inputs, outputs),
       .inputs = inputs,
       .reduceOp = c10d::ReduceOp::SUM,
       .timeout = timeoutOf(opts.timeout)},
      [&](const Runner& runner, const std::optional<PremulFactor>& /*none*/) {
        return launchDelegated(
            runner,
            coalescedOpType(Collective::kAllGather),
            outputs,
            [delegate = runner.delegate,
             outputs,
             inputs,
             opts = askingForWork(opts)]() mutable {
              return delegate->allgather_into_tensor_coalesced(
                  outputs, inputs, opts);
            });
      });
}

c10::intrusive_ptr<c10d::Work> Backend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return chunked(
      {.kind = Collective::kAllGather,
       .opType = c10d::OpType::ALLGATHER,
       .profilingName = "fairring:all_gather",
       .op = Operation::collective("allgather", outputs, inputs).inTurn(),
       .parts = listPair(inputs, outputs),
       .inputs = inputs,
       .reduceOp = c10d::ReduceOp::SUM,
       .timeout = timeoutOf(opts.timeout)},
      [&](const Runner& runner, const std::optional<PremulFactor>& /*none*/) {
        return launchDelegated(
            runner,
            c10d::OpType::ALLGATHER,
            inputs,
            [delegate = runner.delegate,
             outputs,
             inputs,
             opts = askingForWork(opts)]() mutable {
              return delegate->allgather(outputs, inputs, opts);
            });
      });
}

} // namespace fairring
