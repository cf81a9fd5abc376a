#include <torch_headers.h> // first: the precompiled torch headers

#include "backend/chunked_pack.h"

#include <utility>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>

namespace fairring {

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

void unpackInto(
    const at::Tensor& packed, const std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (const auto& tensor : tensors) {
    tensor.copy_(packed.narrow(0, offset, tensor.numel()).view(tensor.sizes()));
    offset += tensor.numel();
  }
}

namespace {

// A pair's N-chunk side as one N x C matrix: a view of the caller's single
// tensor, or a stacked copy of the list.
at::Tensor chunkRows(const ChunkedPart& part, int worldSize) {
  const int64_t columns = part.chunk.numel();
  if (part.chunks.size() == 1) {
    return part.chunks[0].view({worldSize, columns});
  }
  std::vector<at::Tensor> rows;
  rows.reserve(part.chunks.size());
  for (const at::Tensor& chunk : part.chunks) {
    rows.push_back(chunk.reshape({columns}));
  }
  return at::stack(rows);
}

bool isSingleTensorPair(const std::vector<ChunkedPart>& parts) {
  return parts.size() == 1 && parts[0].chunks.size() == 1;
}

} // namespace

PackedChunks::PackedChunks(
    Collective kind,
    std::vector<ChunkedPart> parts,
    int worldSize,
    const std::optional<PremulFactor>& premul)
    : kind_(kind), parts_(std::move(parts)), worldSize_(worldSize) {
  int64_t columns = 0;
  for (const ChunkedPart& part : parts_) {
    columns += part.chunk.numel();
  }
  const at::TensorOptions options = parts_[0].chunk.options();
  if (kind_ == Collective::kReduceScatter) {
    // Input: the pairs' rows side by side, rank r's chunks in row r.
    at::Tensor rows;
    bool copied = true;
    if (parts_.size() == 1) {
      rows = chunkRows(parts_[0], worldSize_);
      copied = parts_[0].chunks.size() != 1;
    } else {
      std::vector<at::Tensor> blocks;
      blocks.reserve(parts_.size());
      for (const ChunkedPart& part : parts_) {
        blocks.push_back(chunkRows(part, worldSize_));
      }
      rows = at::cat(blocks, /*dim=*/1);
    }
    if (premul) {
      if (copied) {
        premul->scale(rows);
      } else {
        rows = premul->scaled(rows);
      }
    }
    input_ = rows.view({-1});
    unpacks_ = parts_.size() != 1;
    output_ =
        unpacks_ ? at::empty({columns}, options) : parts_[0].chunk.view({-1});
    return;
  }
  // All-gather. Input: the pairs' chunks end to end.
  if (parts_.size() == 1) {
    input_ = parts_[0].chunk.view({-1});
  } else {
    std::vector<at::Tensor> chunks;
    chunks.reserve(parts_.size());
    for (const ChunkedPart& part : parts_) {
      chunks.push_back(part.chunk.view({-1}));
    }
    input_ = at::cat(chunks);
  }
  unpacks_ = !isSingleTensorPair(parts_);
  output_ = unpacks_ ? at::empty({worldSize_ * columns}, options)
                     : parts_[0].chunks[0].view({-1});
}

void PackedChunks::unpack() const {
  if (!unpacks_) {
    return;
  }
  if (kind_ == Collective::kReduceScatter) {
    unpackInto(output_, callerOutputs()); // the pairs' chunks, end to end
    return;
  }
  int64_t offset = 0;
  const at::Tensor rows = output_.view({worldSize_, -1});
  for (const ChunkedPart& part : parts_) {
    const int64_t columns = part.chunk.numel();
    const at::Tensor block = rows.narrow(1, offset, columns);
    if (part.chunks.size() == 1) {
      part.chunks[0].view({worldSize_, columns}).copy_(block);
    } else {
      for (int rank = 0; rank < worldSize_; ++rank) {
        part.chunks[rank].view({-1}).copy_(block[rank]);
      }
    }
    offset += columns;
  }
}

std::vector<at::Tensor> PackedChunks::callerOutputs() const {
  std::vector<at::Tensor> outputs;
  for (const ChunkedPart& part : parts_) {
    if (kind_ == Collective::kReduceScatter) {
      outputs.push_back(part.chunk);
    } else {
      outputs.insert(outputs.end(), part.chunks.begin(), part.chunks.end());
    }
  }
  return outputs;
}

} // namespace fairring
