#pragma once

#include <cstdint>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

// The collectives of c10d::Backend that fairring overrides, listed once: the
// Backend declares them from this list and the ReconfigurableBackend forwards
// them from it, so neither restates their signatures, and a collective added
// here is declared and forwarded at once.
//
// FAIRRING_C10D_COLLECTIVES(X) expands X(name, (parameters), (arguments))
// for each; every one returns c10::intrusive_ptr<c10d::Work>. Where the
// Backend runs each: allreduce.cpp (all-reduces), chunked_collectives.cpp
// (reduce-scatters and all-gathers), delegated_collectives.cpp (the rest).
#define FAIRRING_C10D_COLLECTIVES(X)                                         \
  X(broadcast,                                                               \
    (std::vector<at::Tensor> & tensors, const c10d::BroadcastOptions& opts), \
    (tensors, opts))                                                         \
  X(allreduce,                                                               \
    (std::vector<at::Tensor> & tensors, const c10d::AllreduceOptions& opts), \
    (tensors, opts))                                                         \
  X(allreduce_sparse,                                                        \
    (std::vector<at::Tensor> & tensors, const c10d::AllreduceOptions& opts), \
    (tensors, opts))                                                         \
  X(allreduce_coalesced,                                                     \
    (std::vector<at::Tensor> & tensors,                                      \
     const c10d::AllreduceCoalescedOptions& opts),                           \
    (tensors, opts))                                                         \
  X(reduce,                                                                  \
    (std::vector<at::Tensor> & tensors, const c10d::ReduceOptions& opts),    \
    (tensors, opts))                                                         \
  X(allgather,                                                               \
    (std::vector<std::vector<at::Tensor>> & outputs,                         \
     std::vector<at::Tensor> & inputs,                                       \
     const c10d::AllgatherOptions& opts),                                    \
    (outputs, inputs, opts))                                                 \
  X(_allgather_base,                                                         \
    (at::Tensor & output,                                                    \
     at::Tensor & input,                                                     \
     const c10d::AllgatherOptions& opts),                                    \
    (output, input, opts))                                                   \
  X(allgather_coalesced,                                                     \
    (std::vector<std::vector<at::Tensor>> & outputLists,                     \
     std::vector<at::Tensor> & inputs,                                       \
     const c10d::AllgatherOptions& opts),                                    \
    (outputLists, inputs, opts))                                             \
  X(allgather_into_tensor_coalesced,                                         \
    (std::vector<at::Tensor> & outputs,                                      \
     std::vector<at::Tensor> & inputs,                                       \
     const c10d::AllgatherOptions& opts),                                    \
    (outputs, inputs, opts))                                                 \
  X(gather,                                                                  \
    (std::vector<std::vector<at::Tensor>> & outputs,                         \
     std::vector<at::Tensor> & inputs,                                       \
     const c10d::GatherOptions& opts),                                       \
    (outputs, inputs, opts))                                                 \
  X(scatter,                                                                 \
    (std::vector<at::Tensor> & outputs,                                      \
     std::vector<std::vector<at::Tensor>> & inputs,                          \
     const c10d::ScatterOptions& opts),                                      \
    (outputs, inputs, opts))                                                 \
  X(reduce_scatter,                                                          \
    (std::vector<at::Tensor> & outputs,                                      \
     std::vector<std::vector<at::Tensor>> & inputs,                          \
     const c10d::ReduceScatterOptions& opts),                                \
    (outputs, inputs, opts))                                                 \
  X(_reduce_scatter_base,                                                    \
    (at::Tensor & output,                                                    \
     at::Tensor & input,                                                     \
     const c10d::ReduceScatterOptions& opts),                                \
    (output, input, opts))                                                   \
  X(reduce_scatter_tensor_coalesced,                                         \
    (std::vector<at::Tensor> & outputs,                                      \
     std::vector<at::Tensor> & inputs,                                       \
     const c10d::ReduceScatterOptions& opts),                                \
    (outputs, inputs, opts))                                                 \
  X(alltoall_base,                                                           \
    (at::Tensor & output,                                                    \
     at::Tensor & input,                                                     \
     std::vector<int64_t> & outputSplitSizes,                                \
     std::vector<int64_t> & inputSplitSizes,                                 \
     const c10d::AllToAllOptions& opts),                                     \
    (output, input, outputSplitSizes, inputSplitSizes, opts))                \
  X(alltoall,                                                                \
    (std::vector<at::Tensor> & outputs,                                      \
     std::vector<at::Tensor> & inputs,                                       \
     const c10d::AllToAllOptions& opts),                                     \
    (outputs, inputs, opts))                                                 \
  X(send,                                                                    \
    (std::vector<at::Tensor> & tensors, int dstRank, int tag),               \
    (tensors, dstRank, tag))                                                 \
  X(recv,                                                                    \
    (std::vector<at::Tensor> & tensors, int srcRank, int tag),               \
    (tensors, srcRank, tag))                                                 \
  X(recvAnysource,                                                           \
    (std::vector<at::Tensor> & tensors, int tag),                            \
    (tensors, tag))                                                          \
  X(barrier, (const c10d::BarrierOptions& opts), (opts))
