#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <tensorpipe/common/device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "topology.h"

namespace tensorpipe {
class Context;
class Listener;
class Pipe;
} // namespace tensorpipe

namespace fairring {

// The rails mesh: TensorPipe pipes from this rank to its rail peers, the
// ranks with the same local index on every other machine. Rail peers are on
// different machines by definition, so only network transports are used
// (TCP through libuv; InfiniBand where viable and allowed, which TensorPipe
// then prefers between two ranks that both have it), never same-host ones.
//
// Each peer gets two pipes, one per lane, so that reduced shards coming back
// never queue behind shards of a slice the receiver has not started yet.
//
// The mesh carries buffers of one device type: with CUDA, TensorPipe's CUDA
// channels are registered too, and each rank tells its peers which device its
// buffers live on, so that a write names its target device and goes out
// without waiting for the reader to say where the data should land.
//
// Construction is collective over the rail: every rank listens, publishes its
// address and device in the store, connects to the peers on higher machines
// and accepts the others. It returns once every pipe is up, or throws naming the peers
// still missing after `timeout`. TensorPipe runs every callback on its own
// loop thread; the destructor closes the context and joins that thread, so no
// callback outlives the mesh.
class Rails {
 public:
  enum Lane : int { kShards = 0, kReduced = 1 };
  static constexpr int kLanes = 2;

  Rails(
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::string& storePrefix,
      const Topology& topology,
      const std::string& listenAddress,
      c10::Device device,
      bool allowInfiniband,
      std::chrono::milliseconds timeout);
  ~Rails();

  Rails(const Rails&) = delete;
  Rails& operator=(const Rails&) = delete;

  // The pipe to the rail peer on `machine` (not this rank's own machine).
  tensorpipe::Pipe& pipe(int machine, Lane lane) const;
  int peerRank(int machine) const {
    return topology_.railPeers()[machine];
  }
  // Where the rail peer on `machine` receives: the target of every write.
  const tensorpipe::Device& peerDevice(int machine) const {
    return peerDevices_.at(machine);
  }
  // Whether CUDA buffers travel by GPUDirect RDMA (see cuda_support.h).
  bool gpuDirect() const {
    return gpuDirect_;
  }
  const std::string& url() const {
    return url_;
  }
  // Closes every pipe: pending and later reads and writes on them fail, here
  // and at the peers, which thus learn of a failure without waiting for a
  // timeout. Safe from any thread, TensorPipe's included.
  void closePipes();

  // Where this rank listens and what it can speak, for logs.
  std::string describe() const {
    return url_ + " (" + transports_ + ")";
  }

 private:
  const Topology topology_;
  std::shared_ptr<tensorpipe::Context> context_;
  std::shared_ptr<tensorpipe::Listener> listener_;
  std::string url_;
  std::string transports_;
  bool gpuDirect_ = false;
  // By machine; empty for this rank's own machine.
  std::vector<std::array<std::shared_ptr<tensorpipe::Pipe>, kLanes>> pipes_;
  std::vector<tensorpipe::Device> peerDevices_;
};

// The address to listen on: that of `interfaceName`, or, if empty, the one
// TensorPipe picks the way NCCL does. Throws with the reason otherwise.
std::string resolveListenAddress(const std::string& interfaceName);

} // namespace fairring
