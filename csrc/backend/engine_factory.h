#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend/inner_groups.h"
#include "config.h"
#include "engine/engine.h"
#include "topology.h"

namespace fairring {

// What one engine needs from its group, besides what it tells its owner
// (Engine::Owner).
struct EngineSite {
  const Topology& topology;
  const Config& config;
  InnerGroupFactory& innerGroups;
  c10::intrusive_ptr<c10d::Store> store;
  std::string groupUid; // names the timeline's files
  std::chrono::milliseconds timeout;
};

// The engine for `device`, put together in the order every rank follows:
// the local groups first (Python constructs them: local/local_steps.h), then
// the device's context (CUDA, the emulated device of the tests, or the CPU),
// then the rails (rails/mesh_factory.h picks the transport). Called at the
// first all-reduce that needs it, which every rank reaches in the same order.
std::unique_ptr<Engine> makeEngine(
    c10::Device device, const EngineSite& site, Engine::Owner owner);

} // namespace fairring
