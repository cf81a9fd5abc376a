#include "rails/tensorpipe/factory.h"

#include "rails/tensorpipe/mesh.h"

namespace fairring::rails {

bool tensorpipeBuilt() {
  return true;
}

std::unique_ptr<Mesh> makeTensorpipeMesh(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::string& storePrefix,
    const Topology& topology,
    const RailsNetwork& network,
    c10::Device device,
    std::chrono::milliseconds timeout) {
  return std::make_unique<TensorpipeMesh>(
      store, storePrefix, topology, network, device, timeout);
}

} // namespace fairring::rails
