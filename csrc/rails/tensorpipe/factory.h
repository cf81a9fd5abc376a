#pragma once

// The TensorPipe rails as the rest of fairring sees them, whether this build
// has them or not (setup.py: FAIRRING_WITH_TENSORPIPE, on where torch ships
// TensorPipe's headers). With them: rails/tensorpipe/factory.cpp and
// testing/tensorpipe_bindings.cpp; without: rails/tensorpipe/none.cpp, whose
// factory refuses, naming the NIXL rails, and which binds nothing.

#include <chrono>
#include <memory>
#include <string>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "config.h"
#include "rails/transport.h"
#include "topology.h"

namespace pybind11 {
class module_;
} // namespace pybind11

namespace fairring::rails {

// Whether this build has the TensorPipe rails.
bool tensorpipeBuilt();

// The TensorPipe mesh (rails/tensorpipe/mesh.h); arguments as makeMesh's.
std::unique_ptr<Mesh> makeTensorpipeMesh(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::string& storePrefix,
    const Topology& topology,
    const RailsNetwork& network,
    c10::Device device,
    std::chrono::milliseconds timeout);

// Binds the TensorPipe rails' test and benchmark harnesses (check_hello,
// RailsEndpoint, WireProbe) into `module`.
void bindTensorpipe(pybind11::module_& module);

} // namespace fairring::rails
