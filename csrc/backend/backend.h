#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend/inner_groups.h"
#include "config.h"
#include "engine/engine.h"
#include "topology.h"

namespace fairring {

// The c10d backend registered as "fairring" for both CPU and CUDA tensors.
//
// It owns a process group's state and routes each collective by the device
// of its tensors to that device type's delegate: Gloo for CPU tensors, NCCL
// for CUDA tensors (made on first use, and only where a GPU exists). Both are
// made by torch's own constructors, through the InnerGroupFactory. All-reduces
// that span several machines run on the Herring engine instead: always for
// CPU tensors; for CUDA tensors when Config::cudaEngine is set, on an engine
// created by the first CUDA all-reduce, for that tensor's device. All-reduces
// below Config::flatThresholdBytes go to the delegate.
//
// Overrides use the collective names torch 2.11 and 2.15 both have (2.15
// forwards its newer names, e.g. all_gather_single, to them).
//
// Any thread may call the collectives (DDP issues them from autograd
// threads); c10d requires that every rank issues them in the same order.
class Backend final : public c10d::Backend {
 public:
  Backend(
      c10::intrusive_ptr<c10d::Store> store,
      Topology topology,
      Config config,
      std::chrono::milliseconds timeout,
      c10::intrusive_ptr<c10d::Backend> cpuBackend,
      std::shared_ptr<InnerGroupFactory> innerGroups);
  ~Backend() override;

  const Topology& topology() const {
    return topology_;
  }
  const Config& config() const {
    return config_;
  }
  std::chrono::milliseconds timeout() const {
    return timeout_;
  }
  // Null when the group spans a single machine (nothing to send).
  const Engine* cpuEngine() const {
    return cpuEngine_.get();
  }
  // Null until a CUDA all-reduce created it (see Config::cudaEngine).
  const Engine* cudaEngine() const;
  // All-reduces of tensors of `type` that went to the delegate because they
  // were below the flat threshold.
  int64_t flatAllreduces(c10::DeviceType type) const {
    return flatAllreduces_[type == c10::kCPU ? 0 : 1].load();
  }

  const std::string getBackendName() const override {
    return "fairring";
  }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::AllgatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output,
      at::Tensor& input,
      std::vector<int64_t>& outputSplitSizes,
      std::vector<int64_t>& inputSplitSizes,
      const c10d::AllToAllOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> send(
      std::vector<at::Tensor>& tensors,
      int dstRank,
      int tag) override;

  c10::intrusive_ptr<c10d::Work> recv(
      std::vector<at::Tensor>& tensors,
      int srcRank,
      int tag) override;

  c10::intrusive_ptr<c10d::Work> recvAnysource(
      std::vector<at::Tensor>& tensors,
      int tag) override;

  // Barriers run on the CPU group, which every rank has whatever its device.
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts) override;

  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks)
      override;

  // Coalescing (batch_isend_irecv, _coalescing_manager): the first operation
  // in a block decides the device type. Operations for the delegate coalesce
  // natively where it can (NCCL) and run at once where it cannot (Gloo);
  // engine all-reduces run at once. endCoalescing returns one Work for all.
  bool supportsCoalescing() const override {
    return true;
  }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void abort() override;
  void shutdown() override;

 private:
  // The device type shared by all the given tensors (checked), and its
  // delegate, made on first use.
  template <typename... Tensors>
  c10::DeviceType route(const char* opName, const Tensors&... tensors);
  c10d::Backend& delegate(c10::DeviceType type);

  // Runs `call` on the delegate of the tensors' device type, joining an open
  // coalescing block.
  template <typename Call, typename... Tensors>
  c10::intrusive_ptr<c10d::Work> forward(
      const char* opName,
      Call&& call,
      const Tensors&... tensors);
  // The open coalescing block, its device type set by its first operation
  // and checked against `type`; null when none is open. Needs
  // coalescingMutex_.
  struct CoalescingBlock;
  CoalescingBlock* openBlockLocked(const char* opName, c10::DeviceType type);
  // Records an engine op's Work in an open coalescing block.
  void joinBlock(
      const char* opName,
      c10::DeviceType type,
      const c10::intrusive_ptr<c10d::Work>& work);

  bool isCpu(const c10d::Backend& inner) const {
    return &inner == cpuBackend_.get();
  }
  c10::intrusive_ptr<c10d::Work> alltoallAsSingle(
      c10d::Backend& inner,
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts);

  c10d::Backend& cudaBackend();
  c10::intrusive_ptr<c10d::Backend> cudaBackendIfCreated() const;

  // The engine for an all-reduce of `tensors` with `op`, or null: delegate.
  // Creates the CUDA engine on first use: a collective step, as every rank
  // makes its first CUDA all-reduce at the same point of its sequence.
  Engine* engineFor(
      const std::vector<at::Tensor>& tensors,
      c10d::ReduceOp::RedOpType op);
  // An engine on `device`, with its local groups and rails mesh (collective).
  std::unique_ptr<Engine> makeEngine(c10::Device device);
  // Fails every engine's pending ops and aborts their local steps.
  void stopEngines(const std::string& reason);

  const c10::intrusive_ptr<c10d::Store> store_;
  const Topology topology_;
  const Config config_;
  const std::chrono::milliseconds timeout_;
  const c10::intrusive_ptr<c10d::Backend> cpuBackend_;
  const std::shared_ptr<InnerGroupFactory> innerGroups_;
  std::unique_ptr<Engine> cpuEngine_;
  std::array<std::atomic<int64_t>, 2> flatAllreduces_{}; // CPU, CUDA

  // Serialises the creation of CUDA groups and engines, which calls into
  // Python; never held by a thread that holds the GIL.
  std::mutex cudaCreation_;
  mutable std::mutex cudaMutex_; // brief: guards the two pointers below
  c10::intrusive_ptr<c10d::Backend> cudaBackend_;
  std::unique_ptr<Engine> cudaEngine_;

  struct CoalescingBlock {
    std::optional<c10::DeviceType> type; // set by the block's first operation
    c10d::Backend* nativeBlock = nullptr; // delegate coalescing natively
    std::vector<c10::intrusive_ptr<c10d::Work>> works; // the others
  };
  std::mutex coalescingMutex_;
  std::optional<CoalescingBlock> coalescing_; // guarded by coalescingMutex_
};

} // namespace fairring
