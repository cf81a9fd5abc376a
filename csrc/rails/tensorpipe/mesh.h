#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <tensorpipe/common/device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "config.h"
#include "rails/mesh_site.h"
#include "rails/tensorpipe/slots.h"
#include "rails/transport.h"
#include "topology.h"

namespace tensorpipe {
class Context;
class Listener;
class Pipe;
} // namespace tensorpipe

namespace fairring::rails {

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
// Peers are not trusted (acceptor.h): an accepted pipe must open with a
// well-formed hello from a rank expected to connect here, on a lane it may
// use, once, and both ends of every pipe prove they hold the group's rails
// key before it carries anything else (handshake.h). Any other pipe is closed
// and noted (the note shows in a timeout's error and in describe()), and
// accepting goes on until every expected pipe is in; then the listener closes.
// Every message read later is checked against what the reader expects (kind,
// count, length, devices) before TensorPipe is given memory for it
// (connection.h).
//
// Rail switches (rails/failover.h): detach() closes a rail peer's pipes and
// reconnect() makes new ones through another of this machine's interfaces,
// with a listener opened for that one switch and closed once its pipes are
// in, so no listener stays open between switches (rail_switch.cpp). What
// happens to each connection, and when, is in one place: slots.h.
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
  // TensorPipe's cuda_basic staging (two pools of 16 MiB per context, made
  // at its first transfer), where that channel is registered.
  int64_t pinnedHostBytes() const override {
    return cudaBasic_ ? 2 * (int64_t{16} << 20) : 0;
  }
  std::string downInterface() const override;
  bool resends() const override {
    return resends_;
  }
  std::string interfaceName() const override {
    return interfaceName_;
  }
  std::vector<std::string> spareInterfaces() const override;
  void detach(int machine) override;
  ReceivedCounts reconnect(
      int machine,
      const std::string& interface,
      uint64_t generation,
      ReceivedCounts received,
      std::chrono::steady_clock::time_point deadline,
      const std::function<bool()>& cancelled) override;

 private:
  // The URLs to listen on at `address`: uv's first, then the other
  // transports'.
  std::vector<std::string> listenUrls(const std::string& address) const;
  size_t neighbourIndex(int rank) const;
  // "rank R's rails listener <where>", for the log.
  std::string listenerName(const std::string& where) const;
  // A proven pipe as a connection: sealed with its session's keys where
  // the rails encrypt. `dialler`: this rank dialled it.
  std::unique_ptr<TensorpipeConnection> connectionTo(
      const std::shared_ptr<tensorpipe::Pipe>& pipe,
      int deviceIndex,
      const std::string& session,
      bool dialler) const;
  // One side of a switch: what it gives, and what it gets.
  struct SwitchCall {
    int peer;
    uint64_t generation;
    ReceivedCounts received;
    std::string key; // where the listener publishes
    std::chrono::steady_clock::time_point deadline;
    std::function<bool()> cancelled;
  };
  struct Switched {
    std::vector<std::shared_ptr<tensorpipe::Pipe>> pipes; // by lane
    std::vector<std::string> sessions; // by lane
    bool dialled = false;
    ReceivedCounts peerReceived;
    int peerDevice = 0;
  };
  Switched acceptSwitch(const SwitchCall& call, const std::string& interface);
  Switched dialSwitch(const SwitchCall& call);

  const Topology topology_;
  const std::string listenHost_; // the address, without a port
  const std::string interfaceName_;
  const std::vector<std::string> spareNames_; // and their addresses:
  const std::vector<std::string> spareAddresses_;
  const bool resends_;
  const bool encrypt_; // FAIRRING_RAILS_ENCRYPT: every connection sealed
  const c10::intrusive_ptr<c10d::Store> store_;
  const std::string storePrefix_;
  const std::string key_; // the group's rails key (rails/auth/rails_key.h)
  tensorpipe::Device ownDevice_;
  std::vector<std::string> transportNames_; // registered, best first
  bool cudaBasic_ = false; // TensorPipe's cuda_basic channel is registered
  std::shared_ptr<tensorpipe::Context> context_;
  std::shared_ptr<tensorpipe::Listener> listener_;
  std::string url_;
  std::string transports_;
  std::shared_ptr<Accepted> accepted_; // shared with the listener's callbacks
  std::vector<int> neighbours_;
  ConnectionSlots slots_; // the connections, and what happened to them
};

} // namespace fairring::rails
