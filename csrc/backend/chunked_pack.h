#pragma once

// A reduce-scatter or an all-gather in any of c10d's forms, as the one
// engine op that runs it: the engine reads one N x C input (or C) and writes
// one C output (or N x C). One pair of whole tensors, unscaled, runs on the
// caller's own tensors; coalesced pairs, lists and a PREMUL_SUM's scaling
// cost one packing copy before the op and one unpacking copy after it.

#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backend/chunked_path.h"
#include "backend/premul.h"
#include "engine/engine.h"

namespace fairring {

// Aliases of `tensors` that autograd does not see. fairring's own arithmetic
// on a caller's tensors (PREMUL_SUM's scaling, packing, copies back, the
// engine's steps) runs on threads in grad mode, and the tensors may require
// grad (DDP's buckets under backward(create_graph=True)): through an alias it
// stays arithmetic on memory, as Gloo's is, and records no graph. Sparse
// tensors stay themselves: Gloo writes a sparse result by giving the tensor
// object new indices and values, which an alias would take instead.
std::vector<at::Tensor> withoutAutograd(const std::vector<at::Tensor>& tensors);

// Copies consecutive pieces of the 1-D `packed`, each as long as the next
// tensor, into `tensors` (all_reduce_coalesced's, a reduce-scatter's pairs).
void unpackInto(
    const at::Tensor& packed, const std::vector<at::Tensor>& tensors);

class PackedChunks {
 public:
  // Packs `parts` (well formed: chunkedArgs) for a collective of `kind`
  // over `worldSize` ranks, scaling a reduce-scatter's input by `premul`.
  // Reads the inputs: call it once memory order allows.
  PackedChunks(
      Collective kind,
      std::vector<ChunkedPart> parts,
      int worldSize,
      const std::optional<PremulFactor>& premul);

  const at::Tensor& input() const {
    return input_;
  }
  const at::Tensor& output() const {
    return output_;
  }
  // Whether output() is not the caller's, and unpack() must copy it there.
  bool unpacks() const {
    return unpacks_;
  }
  // Copies output() into the callers' tensors (after the op completes).
  void unpack() const;
  // The callers' output tensors, as the Work reports them.
  std::vector<at::Tensor> callerOutputs() const;

 private:
  Collective kind_;
  std::vector<ChunkedPart> parts_;
  int worldSize_;
  at::Tensor input_;
  at::Tensor output_;
  bool unpacks_ = false;
};

} // namespace fairring
