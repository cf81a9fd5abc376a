#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "config.h"
#include "rails/lanes.h"
#include "topology.h"

namespace fairring::rails {

// One send or receive of an Endpoint, for its caller to wait on.
class Transfer {
 public:
  explicit Transfer(at::Tensor tensor) : tensor_(std::move(tensor)) {}
  // Blocks until done; throws the failure's reason, or on timeout.
  void wait(std::chrono::milliseconds timeout);
  void finish(const std::string& error);

 private:
  const at::Tensor tensor_; // kept alive while the rails use its memory
  std::mutex mutex_;
  std::condition_variable done_;
  bool finished_ = false;
  std::string error_;
};

// The rails protocol on its own, over a real TensorPipe mesh: what the tests
// of the protocol and the transport benchmarks use, with the engine's rules
// (tags, lanes, in-order receives into the caller's memory). CUDA tensors are
// sent after, and received for, the work queued on the current stream when
// send or expect is called.
class Endpoint {
 public:
  Endpoint(
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::string& storePrefix,
      const Topology& topology,
      c10::Device device,
      const RailsNetwork& network,
      std::chrono::milliseconds timeout);
  ~Endpoint();

  std::shared_ptr<Transfer> send(
      int machine, Lane lane, std::string tag, const at::Tensor& tensor);
  std::shared_ptr<Transfer> expect(
      int machine, Lane lane, std::string tag, const at::Tensor& tensor);
  void close();
  // A rail switch with the peer on `machine` (rails/failover.h), onto the
  // same interface, with nothing in flight: both ends call it, and it
  // returns once the new pipes are in. For the forger tests of a switch's
  // listener.
  void switchRail(
      int machine, uint64_t generation, std::chrono::milliseconds timeout);
  std::string describe() const {
    return lanes_->mesh().describe();
  }

 private:
  std::shared_ptr<Transfer> track(const at::Tensor& tensor);
  Buffer buffer(const at::Tensor& tensor) const;
  void failAll(const std::string& message);

  const c10::Device device_;
  std::mutex mutex_;
  std::string error_; // guarded by mutex_
  std::vector<std::weak_ptr<Transfer>> pending_; // guarded by mutex_
  // Last: their callbacks use the above. Shut down before Lanes goes.
  std::unique_ptr<Mesh> mesh_;
  std::unique_ptr<Lanes> lanes_;
};

} // namespace fairring::rails
