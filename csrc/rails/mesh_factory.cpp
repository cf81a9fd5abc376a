#include "rails/mesh_factory.h"

#include <c10/util/Exception.h>

#include "rails/nixl/factory.h"
#include "rails/tensorpipe/factory.h"

namespace fairring::rails {

std::unique_ptr<Mesh> makeMesh(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::string& storePrefix,
    const Topology& topology,
    const RailsNetwork& network,
    c10::Device device,
    std::chrono::milliseconds timeout) {
  if (network.transport == "nixl") {
    return makeNixlMesh(store, storePrefix, topology, network, device, timeout);
  }
  TORCH_CHECK(
      network.transport == "tensorpipe",
      "fairring: no rails transport '",
      network.transport,
      "'; FAIRRING_RAILS_TRANSPORT takes tensorpipe or nixl");
  return makeTensorpipeMesh(
      store, storePrefix, topology, network, device, timeout);
}

} // namespace fairring::rails
