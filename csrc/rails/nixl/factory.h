#pragma once

// The NIXL rails as the rest of fairring sees them. Every build has them: the
// library is loaded with dlopen when a mesh is made (rails/nixl/library.h), so
// a build without NIXL installed still compiles them and fails at init,
// saying what to install.

#include <memory>

#include "rails/mesh_site.h"
#include "rails/transport.h"

namespace fairring::rails {

// The NIXL mesh (rails/nixl/mesh.h).
std::unique_ptr<Mesh> makeNixlMesh(const MeshSite& site);

} // namespace fairring::rails
