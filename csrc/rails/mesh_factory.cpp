#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/mesh_factory.h"

#include <c10/util/Exception.h>

#include "rails/nixl/factory.h"
#include "rails/tensorpipe/factory.h"

namespace fairring::rails {

std::unique_ptr<Mesh> makeMesh(const MeshSite& site) {
  const std::string& transport = site.network.transport;
  if (transport == "nixl") {
    return makeNixlMesh(site);
  }
  TORCH_CHECK(
      transport == "tensorpipe",
      "fairring: no rails transport '",
      transport,
      "'; FAIRRING_RAILS_TRANSPORT takes tensorpipe or nixl");
  return makeTensorpipeMesh(site);
}

} // namespace fairring::rails
