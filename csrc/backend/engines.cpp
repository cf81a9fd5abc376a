#include <torch_headers.h> // first: the precompiled torch headers

// The engines a group owns, one per device type, and the sizes each takes:
// made at the first collective that needs one (a point every rank reaches
// alike), measured by FAIRRING_FLAT_THRESHOLD=auto through the funnel, and
// failed together.

#include "backend/backend.h"

#include <algorithm>
#include <limits>

#include <ATen/ops/zeros.h>

#include "backend/allreduce_args.h"
#include "backend/engine_factory.h"

namespace fairring {

const Engine* Backend::engine(c10::DeviceType type) const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return engines_[indexOfType(type)].get();
}

EngineSizes Backend::engineSizesInForce(
    c10::DeviceType type, Collective kind) const {
  const size_t index = sizesIndex(type, kind);
  // The threshold first: auto stores the ceiling before it.
  const int64_t from = flatThresholds_[index].load();
  return EngineSizes{from, engineCeilings_[index].load()};
}

EngineSizes Backend::engineSizesFor(const AllreduceArgs& args) {
  const EngineSizes known = engineSizesInForce(args.deviceType);
  // Still to be measured, the sizes route as a threshold of 0 would: an
  // all-reduce the engine would not take then needs no measurement.
  if (known.fromBytes != kMeasuredThreshold ||
      chooseAllreducePath(args, topology_.servesEngine(), config_, {}).path !=
          AllreducePath::kEngine) {
    return known;
  }
  return measureEngineSizes(args.device, Collective::kAllReduce);
}

EngineSizes Backend::engineSizesFor(
    const ChunkedArgs& args, c10::Device device) {
  const EngineSizes known = engineSizesInForce(args.deviceType, args.kind);
  if (known.fromBytes != kMeasuredThreshold ||
      !chunkedOnEngine(args, topology_.servesEngine(), config_, {})) {
    return known;
  }
  return measureEngineSizes(device, args.kind);
}

EngineSizes Backend::measureEngineSizes(c10::Device device, Collective kind) {
  const size_t index = sizesIndex(device.type(), kind);
  auto& threshold = flatThresholds_[index];
  // Every rank sees the same block here (c10d's order); a captured
  // collective never reaches this (the engine takes none).
  if (coalescingBlockOpen()) {
    return {std::numeric_limits<int64_t>::max()};
  }
  std::lock_guard<std::mutex> measuring(measuringMutex_);
  if (threshold.load() != kMeasuredThreshold) {
    return engineSizesInForce(device.type(), kind);
  }
  MeasuredThreshold measured = innerGroups_->measureFlatThreshold(
      device,
      kind,
      [this, kind](at::Tensor& output, at::Tensor& input, bool onEngine) {
        collectiveOnPath(kind, output, input, onEngine);
      });
  const EngineSizes decided{measured.thresholdBytes, measured.ceilingBytes};
  TORCH_CHECK(
      decided.fromBytes >= 0 && decided.belowBytes >= decided.fromBytes,
      "fairring: the measured engine sizes [",
      decided.fromBytes,
      ", ",
      decided.belowBytes,
      ") are not a range");
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    measured_[index] = std::move(measured);
  }
  // The threshold last: a thread that reads it measured reads the ceiling.
  engineCeilings_[index].store(decided.belowBytes);
  threshold.store(decided.fromBytes);
  return decided;
}

std::optional<MeasuredThreshold> Backend::measuredThreshold(
    c10::DeviceType type, Collective kind) const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return measured_[sizesIndex(type, kind)];
}

void Backend::collectiveOnPath(
    Collective kind, at::Tensor& output, at::Tensor& input, bool onEngine) {
  if (kind == Collective::kAllReduce) {
    allreduceOnPath(output, onEngine);
  } else {
    chunkedOnPath(kind, output, input, onEngine);
  }
}

void Backend::allreduceOnPath(at::Tensor& tensor, bool onEngine) {
  std::vector<at::Tensor> tensors{tensor};
  const c10d::AllreduceOptions opts;
  const AllreduceArgs args = allreduceArgs(
      tensors, opts.reduceOp, AllreduceForm::kOne, /*nativeBlockOpen=*/false);
  const AllreduceRoute route{
      onEngine ? AllreducePath::kEngine : AllreducePath::kDelegate,
      /*premultiplyHere=*/false};
  TORCH_CHECK(
      !onEngine ||
          chooseAllreducePath(args, topology_.servesEngine(), config_, {})
                  .path == AllreducePath::kEngine,
      "fairring: the engine cannot take this all-reduce (",
      args.signature,
      ")");
  issue(
      allreduceOperation("allreduce", args, route, tensors),
      [&](const Runner& runner) {
        return launchAllreduce(runner, tensors, opts, route);
      })
      ->wait();
}

// The one place engines are made: at the group's first all-reduce on the
// engine for a device type, which every rank issues at the same point of its
// sequence, so that making it (a collective step) lines up.
Engine* Backend::ensureEngine(c10::Device device) {
  const size_t index = indexOfType(device.type());
  const auto made = [&] {
    std::lock_guard<std::mutex> lock(stateMutex_);
    return engines_[index].get();
  };
  Engine* engine = made();
  if (engine == nullptr) {
    std::lock_guard<std::mutex> creating(creationMutex_);
    engine = made();
    if (engine == nullptr) {
      {
        // Connecting the engine's NCCL groups inside an open NCCL group call
        // (a native coalescing block) would wait for that block to end.
        std::lock_guard<std::mutex> lock(coalescingMutex_);
        TORCH_CHECK(
            !coalescing_ || coalescing_->nativeBlock == nullptr,
            "fairring: the group's first ",
            device.type(),
            " all-reduce was issued inside a coalescing block after a NCCL "
            "operation; the engine it creates cannot connect there. Issue "
            "one all-reduce before the block, or make the all-reduce the "
            "block's first operation.");
      }
      // What the engine tells its owner arrives on the engine's threads,
      // which it joins before it goes; the backend outlives its engines.
      Engine::Owner owner{
          [this] { return ledger_.report(); },
          [this](int neighbour, std::string_view status) {
            onPeerStatus(neighbour, status);
          },
          [this](const std::string& cause, Engine::FailureKind kind) {
            onEngineFailed(cause, kind);
          }};
      // Collective; calls into Python for the local groups.
      const ProcessCounts before = ProcessCounts::now(device);
      auto created = makeEngine(
          device,
          EngineSite{
              topology_,
              config_,
              *innerGroups_,
              store_,
              getGroupUid(),
              timeout()},
          std::move(owner));
      if (device.is_cuda() || emulatedEager_) {
        warmUp(*created);
      }
      const std::string rails = created->describeRails();
      EngineFootprint footprint = created->footprint(before);
      const std::string held = footprint.describe();
      {
        std::lock_guard<std::mutex> lock(stateMutex_);
        engines_[index] = std::move(created);
        footprints_[index] = std::move(footprint);
        engine = engines_[index].get();
      }
      innerGroups_->engineMade(device, rails, held);
    }
  }
  // One engine per device type, on the device of its first all-reduce; c10d
  // binds a rank to one device, so tensors elsewhere are unusual: the
  // delegate takes them.
  return engine->device() == device ? engine : nullptr;
}

void Backend::warmUp(Engine& engine) {
  // Zeros, so the sum needs no check; the engine's own all-reduce, not a
  // collective of the group's: the ledger and torch's hooks never see it.
  at::Tensor slice = at::zeros(
      {std::max<int64_t>(1, config_.sliceSizeBytes / 4)},
      at::TensorOptions().device(engine.device()).dtype(at::kFloat));
  engine.allreduce(slice, c10d::ReduceOp::SUM, timeout(), ledger_.issued())
      .future->wait();
}

void Backend::prepareEngine(c10::Device device) {
  const bool cuda = device.is_cuda();
  const bool wanted = cuda ? config_.cudaEngine : emulatedEager_;
  // A group kept off the engine has a threshold no all-reduce reaches.
  const bool off =
      config_.flatThresholdBytes(cuda) == std::numeric_limits<int64_t>::max();
  if (!wanted || off || !topology_.servesEngine() ||
      engine(device.type()) != nullptr) {
    return;
  }
  {
    // Inside NCCL's own group call the engine's groups cannot connect: the
    // group's next CUDA collective makes it.
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    if (coalescing_ && coalescing_->nativeBlock != nullptr) {
      return;
    }
  }
  ensureEngine(device);
}

std::optional<EngineFootprint> Backend::footprint(c10::DeviceType type) const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return footprints_[indexOfType(type)];
}

std::array<Engine*, 2> Backend::madeEngines() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return {engines_[0].get(), engines_[1].get()};
}

bool Backend::anyEngineMade() const {
  const auto made = madeEngines();
  return made[0] != nullptr || made[1] != nullptr;
}

void Backend::failGroup(const std::string& what) {
  forEachEngine([&](Engine& engine) { engine.fail(what); });
}

} // namespace fairring
