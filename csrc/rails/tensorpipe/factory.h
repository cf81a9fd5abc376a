#pragma once

// The TensorPipe rails as the rest of fairring sees them, whether this build
// has them or not (setup.py: FAIRRING_WITH_TENSORPIPE, on where torch ships
// TensorPipe's headers). With them: rails/tensorpipe/factory.cpp and
// testing/tensorpipe_bindings.cpp; without: rails/tensorpipe/none.cpp, whose
// factory refuses, naming the NIXL rails, and which binds nothing.

#include <memory>

#include "rails/mesh_site.h"
#include "rails/transport.h"

namespace pybind11 {
class module_;
} // namespace pybind11

namespace fairring::rails {

// Whether this build has the TensorPipe rails.
bool tensorpipeBuilt();

// The TensorPipe mesh (rails/tensorpipe/mesh.h).
std::unique_ptr<Mesh> makeTensorpipeMesh(const MeshSite& site);

// Binds the TensorPipe rails' test and benchmark harnesses (check_hello,
// RailsEndpoint, WireProbe) into `module`.
void bindTensorpipe(pybind11::module_& module);

} // namespace fairring::rails
