#pragma once

#include <chrono>
#include <mutex>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "config.h"
#include "engine.h"
#include "topology.h"

namespace fairring {

// The c10d backend registered as "fairring" for both CPU and CUDA tensors.
//
// It owns a process group's state and routes each collective by the device
// of its tensors: CPU tensors go to an inner Gloo group (built in Python,
// since the torch wheel ships no Gloo headers), CUDA tensors to an inner NCCL
// group created on first use, and only where a GPU exists. All-reduces that
// span several machines run on the Herring engine instead: always for CPU
// tensors; for CUDA tensors when Config::cudaEngine is set, on an engine
// created by the first CUDA all-reduce for that tensor's device.
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
      Engine::Groups cpuLocalGroups);

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

  c10::intrusive_ptr<c10d::Work> all_gather_single(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::AllgatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(
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

  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> all_to_all_single(
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
  // in a block decides the device. NCCL coalesces natively; for Gloo each
  // operation runs at once and endCoalescing returns a Work for all of them.
  bool supportsCoalescing() const override {
    return true;
  }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void setBoundDeviceId(std::optional<at::Device> device) override;
  void abort() override;
  void shutdown() override;

 private:
  // The inner group for the device type shared by all the given tensors.
  template <typename... Tensors>
  c10d::Backend& route(const char* opName, const Tensors&... tensors);

  // Routes an operation and records it when a coalescing block is open.
  template <typename Call, typename... Tensors>
  c10::intrusive_ptr<c10d::Work> forward(
      const char* opName,
      Call&& call,
      const Tensors&... tensors);

  bool isCpu(const c10d::Backend& inner) const {
    return &inner == cpuBackend_.get();
  }
  c10::intrusive_ptr<c10d::Work> alltoallAsSingle(
      c10d::Backend& inner,
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts);

  c10d::Backend& cudaBackend();
  c10d::Backend& cudaBackendLocked();
  c10::intrusive_ptr<c10d::Backend> cudaBackendIfCreated();

  // The engine for an all-reduce of `tensor` on `inner`, or null: delegate.
  // Creates the CUDA engine on first use: a collective step, as every rank
  // makes its first CUDA all-reduce at the same point of its sequence.
  Engine* engineFor(const c10d::Backend& inner, const at::Tensor& tensor);
  std::unique_ptr<Engine> makeCudaEngine(c10::Device device);
  // An engine on `device`, with its rails mesh (a collective step).
  std::unique_ptr<Engine> makeEngine(
      c10::Device device,
      Engine::Groups groups);
  void abortCudaEngine(const std::string& reason);

  const c10::intrusive_ptr<c10d::Store> store_;
  const Topology topology_;
  const Config config_;
  const std::chrono::milliseconds timeout_;
  const c10::intrusive_ptr<c10d::Backend> cpuBackend_;
  std::unique_ptr<Engine> cpuEngine_;

  mutable std::mutex cudaMutex_;
  c10::intrusive_ptr<c10d::Backend> cudaBackend_; // guarded by cudaMutex_
  std::unique_ptr<Engine> cudaEngine_; // guarded by cudaMutex_

  struct CoalescingBlock {
    c10d::Backend* inner = nullptr; // set by the block's first operation
    std::vector<c10::intrusive_ptr<c10d::Work>> works; // only when not native
  };
  std::mutex coalescingMutex_;
  std::optional<CoalescingBlock> coalescing_; // guarded by coalescingMutex_
};

} // namespace fairring
