#include <torch_headers.h> // first: the precompiled torch headers

// The collectives fairring hands to its delegate (Gloo for CPU tensors, NCCL
// for CUDA ones) unchanged, through the funnel: broadcast, reduce, gather,
// scatter, all-to-all, point-to-point and barriers. (Reduce-scatters and
// all-gathers, which the engine may take, are in chunked_collectives.cpp.)

#include "backend/backend.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include "backend/chunked_pack.h"
#include "backend/delegated.h"
#include "backend/work.h"

namespace fairring {

c10::intrusive_ptr<c10d::Work> Backend::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  return issue(
      Operation::collective("broadcast", tensors).inTurn(),
      [&](const Runner& runner) {
        return launchDelegated(
            runner,
            c10d::OpType::BROADCAST,
            tensors,
            [delegate = runner.delegate,
             tensors,
             opts = askingForWork(opts)]() mutable {
              return delegate->broadcast(tensors, opts);
            });
      });
}

c10::intrusive_ptr<c10d::Work> Backend::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return issue(
      Operation::collective("allreduce_sparse", tensors),
      [&](const Runner& runner) {
        return runner.delegate->allreduce_sparse(tensors, askingForWork(opts));
      });
}

c10::intrusive_ptr<c10d::Work> Backend::reduce(
    std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  return issue(
      Operation::collective("reduce", tensors)
          .reducing(opts.reduceOp, tensors)
          .inTurn(),
      [&](const Runner& runner) {
        return launchDelegated(
            runner,
            c10d::OpType::REDUCE,
            tensors,
            [delegate = runner.delegate,
             tensors,
             opts = askingForWork(opts)]() mutable {
              return delegate->reduce(tensors, opts);
            });
      });
}

c10::intrusive_ptr<c10d::Work> Backend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return issue(
      Operation::collective("allgather_coalesced", outputLists, inputs)
          .inTurn(),
      [&](const Runner& runner) {
        return launchDelegated(
            runner,
            c10d::OpType::ALLGATHER_COALESCED,
            inputs,
            [delegate = runner.delegate,
             outputLists,
             inputs,
             opts = askingForWork(opts)]() mutable {
              return delegate->allgather_coalesced(outputLists, inputs, opts);
            });
      });
}

c10::intrusive_ptr<c10d::Work> Backend::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return issue(
      Operation::collective("gather", outputs, inputs).inTurn(),
      [&](const Runner& runner) {
        return launchDelegated(
            runner,
            c10d::OpType::GATHER,
            inputs,
            [delegate = runner.delegate,
             outputs,
             inputs,
             opts = askingForWork(opts)]() mutable {
              return delegate->gather(outputs, inputs, opts);
            });
      });
}

c10::intrusive_ptr<c10d::Work> Backend::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return issue(
      Operation::collective("scatter", outputs, inputs).inTurn(),
      [&](const Runner& runner) {
        return launchDelegated(
            runner,
            c10d::OpType::SCATTER,
            outputs,
            [delegate = runner.delegate,
             outputs,
             inputs,
             opts = askingForWork(opts)]() mutable {
              return delegate->scatter(outputs, inputs, opts);
            });
      });
}

c10::intrusive_ptr<c10d::Work> Backend::alltoall_base(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes,
    const c10d::AllToAllOptions& opts) {
  return issue(
      Operation::collective("all_to_all_single", output, input).inTurn(),
      [&](const Runner& runner) {
        return launchDelegated(
            runner,
            c10d::OpType::ALLTOALL_BASE,
            {output},
            [delegate = runner.delegate,
             output,
             input,
             outputSplitSizes,
             inputSplitSizes,
             opts = askingForWork(opts)]() mutable {
              return delegate->alltoall_base(
                  output, input, outputSplitSizes, inputSplitSizes, opts);
            });
      });
}

c10::intrusive_ptr<c10d::Work> Backend::alltoall(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  return issue(
      Operation::collective("alltoall", outputs, inputs).inTurn(),
      [&](const Runner& runner) {
        // The engines, which make launches in turn, go before this Backend.
        return launchDelegated(
            runner,
            c10d::OpType::ALLTOALL,
            outputs,
            [this,
             delegate = runner.delegate,
             gloo = isCpu(*runner.delegate),
             outputs,
             inputs,
             opts = askingForWork(opts),
             seq = *runner.seq]() mutable {
              return gloo
                  ? alltoallAsSingle(*delegate, outputs, inputs, opts, seq)
                  : delegate->alltoall(outputs, inputs, opts);
            });
      });
}

// Gloo's list alltoall needs every tensor to have one shape; NCCL's does not.
// Sending the flattened lists with element splits serves any shapes.
c10::intrusive_ptr<c10d::Work> Backend::alltoallAsSingle(
    c10d::Backend& gloo,
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts,
    uint64_t seq) {
  TORCH_CHECK(
      static_cast<int>(outputs.size()) == getSize() &&
          static_cast<int>(inputs.size()) == getSize(),
      "fairring: alltoall needs one input and one output tensor per rank (",
      getSize(),
      "), got ",
      inputs.size(),
      " inputs and ",
      outputs.size(),
      " outputs");
  std::vector<at::Tensor> flatInputs;
  std::vector<int64_t> inputSplits;
  std::vector<int64_t> outputSplits;
  int64_t outputElements = 0;
  for (int peer = 0; peer < getSize(); ++peer) {
    TORCH_CHECK(
        inputs[peer].scalar_type() == inputs[0].scalar_type() &&
            outputs[peer].scalar_type() == inputs[0].scalar_type(),
        "fairring: alltoall tensors must share one dtype");
    flatInputs.push_back(inputs[peer].detach().reshape({-1}));
    inputSplits.push_back(inputs[peer].numel());
    outputSplits.push_back(outputs[peer].numel());
    outputElements += outputs[peer].numel();
  }
  at::Tensor packedInput = at::cat(flatInputs);
  at::Tensor packedOutput = at::empty({outputElements}, packedInput.options());
  auto work = gloo.alltoall_base(
      packedOutput, packedInput, outputSplits, inputSplits, opts);
  // Runs on Gloo's worker thread once the exchange is done: unpack.
  auto unpacked = work->getFuture()->then(
      [outputs = withoutAutograd(outputs), packedOutput, packedInput](
          c10::ivalue::Future& done) {
        done.value(); // rethrows the exchange's error, if any
        unpackInto(packedOutput, outputs);
        return c10::IValue(outputs);
      },
      c10::ListType::create(c10::TensorType::get()));
  return c10::make_intrusive<FutureWork>(
      unpacked, c10d::OpType::ALLTOALL, "fairring:all_to_all", seq, inputs);
}

c10::intrusive_ptr<c10d::Work> Backend::send(
    std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return issue(
      Operation::pointToPoint("send", tensors), [&](const Runner& runner) {
        return runner.delegate->send(tensors, dstRank, tag);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::recv(
    std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return issue(
      Operation::pointToPoint("recv", tensors), [&](const Runner& runner) {
        return runner.delegate->recv(tensors, srcRank, tag);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::recvAnysource(
    std::vector<at::Tensor>& tensors, int tag) {
  return issue(
      Operation::pointToPoint("recvAnysource", tensors),
      [&](const Runner& runner) {
        return runner.delegate->recvAnysource(tensors, tag);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::barrier(
    const c10d::BarrierOptions& opts) {
  return issue(
      Operation{
          .name = "barrier",
          .type = c10::kCPU,
          .signature = "barrier",
          .coalesces = false},
      [&](const Runner& runner) {
        return runner.delegate->barrier(askingForWork(opts));
      });
}

void Backend::monitoredBarrier(
    const c10d::BarrierOptions& opts, bool waitAllRanks) {
  // Returns nothing to watch or report: the ledger and refusal only.
  nextCollective("monitored_barrier");
  checkNotFailed("monitored_barrier");
  cpuBackend_->monitoredBarrier(opts, waitAllRanks);
}

} // namespace fairring
