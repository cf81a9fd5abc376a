#include "device/device.h"

#include <algorithm>
#include <thread>

#include <c10/util/Exception.h>

#include "engine/reduction.h"

namespace fairring {

const char* stageName(Stage stage) {
  switch (stage) {
    case Stage::kReduceScatter:
      return "reduce-scatter";
    case Stage::kReduce:
      return "reduce";
    case Stage::kAllGather:
      return "all-gather";
  }
  return "?";
}

namespace {

// What is left of an op's time, for a local step's own timeout: the group
// gives up on its own by the op's deadline, even where nothing aborts it.
std::chrono::milliseconds remaining(DeviceContext::Clock::time_point deadline) {
  return std::max(
      std::chrono::milliseconds(1),
      std::chrono::ceil<std::chrono::milliseconds>(
          deadline - DeviceContext::Clock::now()));
}

} // namespace

DeviceContext::DeviceContext(c10::Device device, LocalGroups groups)
    : device_(device),
      groups_(std::move(groups)),
      localWaits_(std::make_shared<LocalWaits>()) {}

DeviceContext::~DeviceContext() {
  if (abandonedLocalStep_) {
    // A Gloo group waits for its step in flight before it is destroyed, until
    // the step's own timeout (the op's deadline) ends it: a detached thread
    // drops the groups, so that shutdown does not wait. It owns nothing else.
    std::thread([groups = std::move(groups_)]() mutable {
      groups = LocalGroups{};
    }).detach();
  }
}

void DeviceContext::localReduceScatter(
    at::Tensor& slot,
    at::Tensor& parts,
    at::Tensor& input,
    c10d::ReduceOp::RedOpType op,
    const LocalStepKey& key,
    Clock::time_point deadline) {
  if (groups_.sharedMemory) {
    groups_.sharedMemory->reduceScatter(slot, input, op, key, deadline);
    return;
  }
  if (!groups_.reduceScatter) {
    slot.copy_(input);
    return;
  }
  std::vector<int64_t> equalSplits;
  c10d::AllToAllOptions options;
  options.timeout = remaining(deadline);
  // The name both torch 2.11 and 2.15 have (2.15 also calls it all_to_all_single).
  waitForLocalStep(groups_.reduceScatter->alltoall_base(
      parts, input, equalSplits, equalSplits, options));
  for (int64_t part = 1; part < parts.size(0); ++part) {
    combineInto(slot, parts[part], op);
  }
}

void DeviceContext::localAllGather(
    at::Tensor& output,
    at::Tensor& part,
    const LocalStepKey& key,
    Clock::time_point deadline) {
  if (groups_.sharedMemory) {
    groups_.sharedMemory->allGather(output, part, key, deadline);
    return;
  }
  if (!groups_.allGather) {
    output.copy_(part);
    return;
  }
  c10d::AllgatherOptions options;
  options.timeout = remaining(deadline);
  waitForLocalStep(groups_.allGather->_allgather_base(output, part, options));
}

void DeviceContext::waitForLocalStep(
    const c10::intrusive_ptr<c10d::Work>& work) {
  auto waits = localWaits_;
  auto done = std::make_shared<bool>(false); // guarded by waits->mutex
  work->getFuture()->addCallback([waits, done](c10::ivalue::Future&) {
    std::lock_guard<std::mutex> lock(waits->mutex);
    *done = true;
    waits->changed.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(waits->mutex);
    waits->changed.wait(lock, [&] { return *done || waits->aborted; });
    if (!*done) {
      abandonedLocalStep_ = true;
      TORCH_CHECK(false, "the engine stopped while the step was in flight");
    }
  }
  work->wait(); // done: rethrows the step's error, if any
}

std::string DeviceContext::localStepsName() const {
  if (groups_.sharedMemory) {
    return "shared memory";
  }
  return groups_.reduceScatter ? groups_.reduceScatter->getBackendName()
                               : "none";
}

void DeviceContext::abort() {
  if (aborted_.exchange(true)) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(localWaits_->mutex);
    localWaits_->aborted = true;
  }
  localWaits_->changed.notify_all();
  if (groups_.sharedMemory) {
    groups_.sharedMemory->abort();
  }
  for (const auto& group : {groups_.reduceScatter, groups_.allGather}) {
    if (group) {
      group->abort();
    }
  }
}

namespace {

// The CPU: work is done when the call that does it returns, so there is
// nothing to order, record or keep alive.
class CpuContext final : public DeviceContext {
 public:
  explicit CpuContext(LocalGroups groups)
      : DeviceContext(c10::Device(c10::kCPU), std::move(groups)) {}

  Fence adoptInput(const at::Tensor& /*flat*/, const at::Tensor& /*tensor*/)
      override {
    return Fence();
  }
  std::vector<c10::Device> futureDevices() const override {
    return {};
  }
  void runStage(Stage /*stage*/, const std::function<void()>& loop) override {
    loop();
  }
  void waitOnDevice(const Fence& /*fence*/) override {}
  Fence record() override {
    return Fence();
  }
  bool waitOnHost(
      const Fence& /*fence*/,
      const std::function<bool()>& cancelled) override {
    return !cancelled();
  }
  at::TensorOptions memoryOptions() const override {
    return at::TensorOptions().device(c10::kCPU);
  }
  void keepAlive(const at::Tensor& /*tensor*/) override {}
  rails::Buffer sendBuffer(const at::Tensor& tensor) override {
    return hostBuffer(tensor);
  }
  rails::Buffer receiveBuffer(const at::Tensor& tensor) override {
    return hostBuffer(tensor);
  }
  Fence receivedFence() override {
    return Fence();
  }
  int64_t minShardBytes() const override {
    return 1;
  }

 private:
  static rails::Buffer hostBuffer(const at::Tensor& tensor) {
    return rails::Buffer{
        tensor.data_ptr(),
        static_cast<size_t>(tensor.numel() * tensor.element_size()),
        c10::Device(c10::kCPU),
        std::nullopt};
  }
};

} // namespace

std::unique_ptr<DeviceContext> makeCpuContext(LocalGroups groups) {
  return std::make_unique<CpuContext>(std::move(groups));
}

} // namespace fairring
