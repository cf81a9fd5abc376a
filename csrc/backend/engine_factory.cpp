#include "backend/engine_factory.h"

#include "device/device.h"
#include "device/emulated.h"
#include "local/local_steps.h"
#include "rails/mesh_factory.h"

namespace fairring {

std::unique_ptr<Engine> makeEngine(
    c10::Device device,
    const EngineSite& site,
    Engine::Hooks hooks) {
  const Topology& topology = site.topology;
  auto localSteps = makeLocalSteps(
      site.innerGroups.localGroups(device), topology.localSize());
  std::unique_ptr<DeviceContext> context;
  if (device.is_cuda()) {
    context = makeCudaContext(device);
  } else if (const auto emulated = emulatedDeviceFromEnv()) {
    context = makeEmulatedContext(*emulated, topology.rank());
  } else {
    context = makeCpuContext();
  }
  auto mesh = rails::makeMesh(
      site.store,
      "fairring/rails/" + c10::DeviceTypeName(device.type(), true) + "/",
      topology,
      site.config.network,
      device,
      site.timeout);
  auto timeline = site.config.timelineDirectory.empty()
      ? nullptr
      : std::make_unique<Timeline>(
            site.config.timelineDirectory, site.groupUid, topology, device);
  return std::make_unique<Engine>(
      topology,
      site.config,
      std::move(context),
      std::move(localSteps),
      std::move(mesh),
      site.timeout,
      std::move(timeline),
      std::move(hooks));
}

} // namespace fairring
