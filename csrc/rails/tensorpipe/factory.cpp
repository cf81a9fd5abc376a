#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/tensorpipe/factory.h"

#include "rails/tensorpipe/mesh.h"

namespace fairring::rails {

bool tensorpipeBuilt() {
  return true;
}

std::unique_ptr<Mesh> makeTensorpipeMesh(const MeshSite& site) {
  return std::make_unique<TensorpipeMesh>(site);
}

} // namespace fairring::rails
