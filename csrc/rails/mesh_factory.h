#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "config.h"
#include "rails/transport.h"
#include "topology.h"

namespace fairring::rails {

// The rails mesh of the transport `network` names (TensorPipe or NIXL), for
// this rank of `topology`, carrying buffers on `device`. Collective, like
// the meshes' own constructors; rendezvous keys go under `storePrefix`.
std::unique_ptr<Mesh> makeMesh(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::string& storePrefix,
    const Topology& topology,
    const RailsNetwork& network,
    c10::Device device,
    std::chrono::milliseconds timeout);

} // namespace fairring::rails
