#pragma once

// The NIXL rails as the rest of fairring sees them. Every build has them: the
// library is loaded with dlopen when a mesh is made (rails/nixl/library.h), so
// a build without NIXL installed still compiles them and fails at init,
// saying what to install.

#include <chrono>
#include <memory>
#include <string>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "config.h"
#include "rails/transport.h"
#include "topology.h"

namespace fairring::rails {

// The NIXL mesh (rails/nixl/mesh.h); arguments as makeMesh's.
std::unique_ptr<Mesh> makeNixlMesh(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::string& storePrefix,
    const Topology& topology,
    const RailsNetwork& network,
    c10::Device device,
    std::chrono::milliseconds timeout);

} // namespace fairring::rails
