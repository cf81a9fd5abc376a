#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "backend/measured_threshold.h"
#include "engine/engine.h"
#include "local/local_steps.h"

namespace fairring {

// Makes the inner process groups a Backend needs, through torch's own public
// constructors (fairring/_registration.py implements it in Python: the torch
// wheel ships no Gloo headers, and NCCL groups made there need no NCCL
// headers here). Every call is collective over the ranks it names, and the
// Backend calls it at points every rank reaches in the same order.
class InnerGroupFactory {
 public:
  virtual ~InnerGroupFactory() = default;

  // The group over every rank that serves tensors of `type` (NCCL for CUDA).
  virtual c10::intrusive_ptr<c10d::Backend> delegate(c10::DeviceType type) = 0;
  // The local-step groups of the engine on `device`, made and connected, one
  // after the other, in the same order on every rank of the machine; null
  // with one rank per machine.
  virtual LocalGroups localGroups(c10::Device device) = 0;
  // The group's whole layout: machines[m] lists machine m's ranks by local
  // index. Collective over every rank of the group (each calls it at the
  // same point): the engine's first reduce-scatter or all-gather.
  virtual std::vector<std::vector<int>> layout() = 0;
  // Told once the engine on `device` exists: where its rails listen, and
  // what it holds (EngineFootprint::describe()), logged.
  virtual void engineMade(
      c10::Device device,
      const std::string& rails,
      const std::string& held) = 0;
  // A notice for the log (INFO), once per process for each text: an
  // all-reduce the engine would take went elsewhere, and why, or a fallback
  // the group took. Any issuing thread.
  virtual void noticeOnce(const std::string& text) = 0;
  // The group is shutting down (destroy_process_group): what its
  // collectives went through is said once, from `backend`'s usage
  // (fairring/_summary.py). Must not throw.
  virtual void shuttingDown(const c10::intrusive_ptr<c10d::Backend>& backend) {
    (void)backend;
  }
  // FAIRRING_FLAT_THRESHOLD=auto: the threshold for tensors of `device`'s
  // type, measured with `run` (or read from an earlier job's measurement).
  // Collective over every rank of the group: each calls it at the same
  // point, and each gets the same answer.
  virtual MeasuredThreshold measureFlatThreshold(
      c10::Device device, Collective kind, CollectiveOnPath run) = 0;
  // A new fairring backend for the group of the given ranks (of this
  // group; sorted, this rank among them), as c10d's split_group asks for.
  // Collective over those ranks only; `store` is the new group's.
  virtual c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::vector<int>& ranks,
      std::chrono::milliseconds timeout,
      const std::string& groupName) = 0;
  // A new fairring backend for this group's ranks `survivors` (sorted, this
  // rank among them), as c10d's shrink_group asks for. Collective over the
  // survivors only, which meet under `key` in this group's store; their
  // CUDA delegate is `cudaDelegate` where this group had one (NCCL's own
  // shrink of it), else made on first use.
  virtual c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int>& survivors,
      std::chrono::milliseconds timeout,
      const std::string& key,
      c10::intrusive_ptr<c10d::Backend> cudaDelegate) = 0;
};

} // namespace fairring
