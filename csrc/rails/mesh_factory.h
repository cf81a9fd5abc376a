#pragma once

#include <memory>

#include "rails/mesh_site.h"
#include "rails/transport.h"

namespace fairring::rails {

// The rails mesh of the transport `site.network` names (TensorPipe or NIXL),
// for this rank of `site.topology`. Collective, like the meshes' own
// constructors.
std::unique_ptr<Mesh> makeMesh(const MeshSite& site);

} // namespace fairring::rails
