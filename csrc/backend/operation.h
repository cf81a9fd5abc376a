#pragma once

// One operation as the backend's funnel (Backend::issue) takes it: what the
// steps every collective shares need to know, taken from its arguments at
// the door.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "backend/path_reason.h"
#include "engine/collective.h"

namespace fairring {

namespace detail {

template <typename Visit>
void forEachTensor(const at::Tensor& tensor, Visit&& visit) {
  visit(tensor);
}

template <typename Visit>
void forEachTensor(const std::vector<at::Tensor>& tensors, Visit&& visit) {
  for (const auto& tensor : tensors) {
    visit(tensor);
  }
}

template <typename Visit>
void forEachTensor(
    const std::vector<std::vector<at::Tensor>>& tensorLists, Visit&& visit) {
  for (const auto& tensors : tensorLists) {
    forEachTensor(tensors, visit);
  }
}

} // namespace detail

// The device type shared by all the given tensors (each a tensor, a list or a
// list of lists): CPU where there are none. Throws, saying what to change,
// where they mix types or sit on a device fairring does not serve.
template <typename... Tensors>
c10::DeviceType deviceTypeOf(const char* opName, const Tensors&... tensors) {
  std::optional<c10::Device> first;
  auto visit = [&](const at::Tensor& tensor) {
    const c10::Device device = tensor.device();
    if (!first) {
      first = device;
      return;
    }
    TORCH_CHECK(
        device.type() == first->type(),
        "fairring: ",
        opName,
        " got tensors on both ",
        *first,
        " and ",
        device,
        "; all tensors of one operation must be on the same device type");
  };
  (detail::forEachTensor(tensors, visit), ...);
  if (!first || first->is_cpu()) {
    return c10::kCPU;
  }
  TORCH_CHECK(
      first->is_cuda(),
      "fairring: ",
      opName,
      " got a tensor on ",
      *first,
      "; fairring supports CPU and CUDA tensors");
  return c10::kCUDA;
}

struct Operation {
  const char* name = ""; // c10d's, for messages
  c10::DeviceType type = c10::kCPU; // its tensors'
  // A collective's signature, the part of its arguments every rank gives
  // alike (the ledger compares it). None for a send or a receive, which ranks
  // issue in different numbers: those are not numbered, refused, watched or
  // ordered by memory.
  std::optional<std::string> signature;
  std::vector<at::Tensor> touches; // every tensor it reads or writes
  // A reduction's op (as it reaches the delegate) and the tensors it
  // reduces, which must follow Gloo's rules where Gloo runs it.
  std::optional<c10d::ReduceOp> reduceOp;
  std::vector<at::Tensor> reduced;
  // The device of an all-reduce that the path decision sent to the engine.
  std::optional<c10::Device> engineDevice;
  // Whether it joins an open coalescing block (a barrier does not: it runs
  // on the CPU group whatever the block holds).
  bool coalesces = true;
  // A delegated launch that may wait for its turn in the engine's launch
  // order rather than keep its caller waiting (Engine::launchInTurn): every
  // delegated collective whose launch owns its arguments (Backend::
  // launchDelegated), not a point-to-point operation, barrier or
  // all_reduce_coalesced.
  bool launchesInTurn = false;
  // Whether it is issued during CUDA graph capture (graphCaptureUnderway),
  // where the door already asked to choose its path; else the funnel asks.
  std::optional<bool> captured;
  // A caller's all-reduce, reduce-scatter or all-gather, counted in the
  // group's Usage (fairring._summary) as `kind` of `bytes` (its N-chunk
  // tensors'). One rule: the door a caller's collective enters by sets it
  // (countedAs); auto's measurements enter past those doors, uncounted.
  struct Counted {
    Collective kind = Collective::kAllReduce;
    int64_t bytes = 0;
    PathReason reason = PathReason::kEngine; // why its path
  };
  std::optional<Counted> counted;

  // A collective on `tensors` (each a tensor, a list or a list of lists):
  // its signature is its name and device type.
  template <typename... Tensors>
  static Operation collective(const char* name, const Tensors&... tensors) {
    Operation op = on(name, tensors...);
    op.signature = std::string(name) + " " +
        c10::DeviceTypeName(op.type, /*lower_case=*/true);
    return op;
  }

  // This operation, launched in its turn (launchesInTurn).
  Operation inTurn() && {
    launchesInTurn = true;
    return std::move(*this);
  }

  // A send or a receive of `tensors`.
  static Operation pointToPoint(
      const char* name, const std::vector<at::Tensor>& tensors) {
    return on(name, tensors);
  }

  // An operation named `name` on `tensors`, not yet a collective.
  template <typename... Tensors>
  static Operation on(const char* name, const Tensors&... tensors) {
    Operation op;
    op.name = name;
    op.type = deviceTypeOf(name, tensors...);
    (detail::forEachTensor(
         tensors, [&](const at::Tensor& t) { op.touches.push_back(t); }),
     ...);
    return op;
  }

  // This operation is a caller's `kind` of `bytes`, on its path for
  // `reason` (see `counted`).
  Operation countedAs(Collective kind, int64_t bytes, PathReason reason) && {
    counted = Counted{kind, bytes, reason};
    return std::move(*this);
  }

  // This operation reduces `tensors` with `op`.
  Operation reducing(c10d::ReduceOp op, std::vector<at::Tensor> tensors) && {
    reduceOp = std::move(op);
    reduced = std::move(tensors);
    return std::move(*this);
  }
};

// The device an operation's tensors are on (the CPU where it has none).
inline c10::Device deviceOf(const Operation& op) {
  return op.touches.empty() ? c10::Device(c10::kCPU) : op.touches[0].device();
}

} // namespace fairring
