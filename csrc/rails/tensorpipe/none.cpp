#include <torch_headers.h> // first: the precompiled torch headers

// What a build without TensorPipe has in place of the TensorPipe rails.

#include "rails/tensorpipe/factory.h"

#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

namespace fairring::rails {

bool tensorpipeBuilt() {
  return false;
}

std::unique_ptr<Mesh> makeTensorpipeMesh(const MeshSite& /*site*/) {
  TORCH_CHECK(
      false,
      "fairring was built without TensorPipe (FAIRRING_WITH_TENSORPIPE=0, or "
      "a torch without it), so its rails cannot use it; set "
      "FAIRRING_RAILS_TRANSPORT=nixl");
}

void bindTensorpipe(pybind11::module_& /*module*/) {}

} // namespace fairring::rails
