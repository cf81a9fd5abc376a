#pragma once

#include <chrono>
#include <string>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "config.h"
#include "topology.h"

namespace fairring::rails {

// What every transport's mesh is made from: the group's store, under whose
// `storePrefix` the mesh's rendezvous keys go, this rank's place in the
// topology, the network Python chose for its rails, the device its buffers
// live on, and how long connecting may take. Made for one factory call, so it
// refers to the caller's store, topology and network rather than copying them.
struct MeshSite {
  const c10::intrusive_ptr<c10d::Store>& store;
  std::string storePrefix;
  const Topology& topology;
  const RailsNetwork& network;
  c10::Device device;
  std::chrono::milliseconds timeout;
};

} // namespace fairring::rails
