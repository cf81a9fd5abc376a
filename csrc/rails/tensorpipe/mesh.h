#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <tensorpipe/common/device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "config.h"
#include "rails/mesh_site.h"
#include "rails/transport.h"
#include "topology.h"

namespace tensorpipe {
class Context;
class Listener;
class Pipe;
} // namespace tensorpipe

namespace fairring::rails {

class TensorpipeConnection;
struct Accepted;

// The rails mesh over TensorPipe: one pipe per rail peer and lane. Rail peers
// are on different machines by definition, so only network transports and
// channels are registered, those `network` allows (chosen and logged in
// Python: TCP through libuv, InfiniBand where viable and allowed, which
// TensorPipe then prefers between two ranks that both have it), never
// same-host ones (shm, cma, CUDA IPC). It listens on `network`'s address
// only.
//
// The mesh carries buffers of one device type: with CUDA, TensorPipe's CUDA
// channels are registered too (see cuda.h), and each rank tells its
// peers which device its buffers live on, so that a write names its target
// device and goes out without waiting for the reader to say where it lands.
//
// Construction is collective over the rail and the machine: every rank
// listens, publishes its address and device in the store, connects to the
// rail peers on higher machines (data lanes and control) and to the ranks of
// its machine with a higher local index (control), and accepts the others. It
// returns once every pipe is up, or throws naming the peers still missing
// after `timeout`.
//
// Peers are not trusted: an accepted pipe must open with a well-formed hello
// from a rank expected to connect here, on a lane it may use, once. Any other
// pipe is closed and noted (the note shows in a timeout's error and in
// describe()), and accepting goes on until every expected pipe is in; then
// the listener closes. Every message read later is checked against what the
// reader expects (kind, count, length, devices) before TensorPipe is given
// memory for it.
//
// TensorPipe runs every callback on its own loop thread; shutdown() (and the
// destructor) close the context and join that thread.
class TensorpipeMesh final : public Mesh {
 public:
  explicit TensorpipeMesh(const MeshSite& site);
  ~TensorpipeMesh() override;

  int machine() const override {
    return topology_.machine();
  }
  int numMachines() const override {
    return topology_.numMachines();
  }
  int peerRank(int machine) const override {
    return topology_.railPeers()[machine];
  }
  Connection& connection(int machine, Lane lane) override;
  const std::vector<int>& neighbours() const override {
    return neighbours_;
  }
  Connection& control(size_t index) override;
  void close() override;
  void shutdown() override;
  // The URL, transports and channels; then the pipes the listener rejected
  // (bad or unexpected hellos), if any: how many, and why for the first few.
  std::string describe() const override;
  std::string downInterface() const override;

 private:
  const Topology topology_;
  const std::string listenHost_; // the address, without a port
  std::shared_ptr<tensorpipe::Context> context_;
  std::shared_ptr<tensorpipe::Listener> listener_;
  std::string url_;
  std::string transports_;
  std::shared_ptr<Accepted> accepted_; // shared with the listener's callbacks
  // By machine; empty for this rank's own machine.
  std::vector<std::array<std::unique_ptr<TensorpipeConnection>, kLanes>>
      connections_;
  std::vector<int> neighbours_;
  std::vector<std::unique_ptr<TensorpipeConnection>> controls_; // by neighbour
};

// Parses a peer's hello (wire.h) and checks every field against what this
// rank accepts (exposed for tests). Lane kLanes is the control lane. Returns
// an empty string and sets the outputs if it is acceptable, else why not.
std::string checkHello(
    const std::string& hello,
    const Topology& topology,
    bool cuda,
    int& rank,
    int& lane,
    int& deviceIndex);

} // namespace fairring::rails
