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

// NCCL's watchdog ends a whole process when a step outlives its timeout, so
// a NCCL step gets this long past the op's deadline: the engine's watchdog
// fails the op first, with the cause it knows (Engine::kSettleGrace, twice,
// and some to spare), and aborts the step.
constexpr std::chrono::milliseconds kNcclStepLag{10000};

// A local step's own timeout: what is left of the op's time. A Gloo group
// gives up on its own by the op's deadline, even where nothing aborts it.
std::chrono::milliseconds stepTimeout(
    const c10d::Backend& group,
    DeviceContext::Clock::time_point deadline) {
  const auto remaining = std::max(
      std::chrono::milliseconds(1),
      std::chrono::ceil<std::chrono::milliseconds>(
          deadline - DeviceContext::Clock::now()));
  return group.getBackendName() == "nccl" ? remaining + kNcclStepLag
                                          : remaining;
}

} // namespace

DeviceContext::DeviceContext(c10::Device device, LocalGroups groups)
    : device_(device),
      groups_(std::move(groups)),
      localWaits_(std::make_shared<LocalWaits>()) {}

DeviceContext::~DeviceContext() {
  join();
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
  options.timeout = stepTimeout(*groups_.reduceScatter, deadline);
  // NCCL runs a synchronous step on the caller's current stream, the stage's
  // own (docs/design.md, "Streams and fences"), not on a stream of its own.
  options.asyncOp = false;
  // The name both torch 2.11 and 2.15 have (2.15 also calls it all_to_all_single).
  waitForLocalStep(*groups_.reduceScatter, groups_.reduceScatter->alltoall_base(
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
  options.timeout = stepTimeout(*groups_.allGather, deadline);
  options.asyncOp = false;
  waitForLocalStep(
      *groups_.allGather,
      groups_.allGather->_allgather_base(output, part, options));
}

void DeviceContext::waitForLocalStep(
    const c10d::Backend& group,
    const c10::intrusive_ptr<c10d::Work>& work) {
  if (group.getBackendName() == "nccl") {
    if (work) {
      work->wait(); // the current stream waits, if it ran on another
    }
    return;
  }
  TORCH_CHECK(work, "the ", group.getBackendName(), " group returned no Work");
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
  abortQueues();
  if (groups_.reduceScatter || groups_.allGather) {
    aborting_ = std::thread(
        [reduceScatter = groups_.reduceScatter, allGather = groups_.allGather] {
          for (const auto& group : {reduceScatter, allGather}) {
            if (group) {
              group->abort();
            }
          }
        });
  }
}

void DeviceContext::join() {
  joinQueues();
  if (aborting_.joinable()) {
    aborting_.join();
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
  void enqueue(Stage /*stage*/, std::function<void()> work) override {
    work();
  }
  void waitOnDevice(Stage /*stage*/, const Fence& /*fence*/) override {}
  Fence record(Stage /*stage*/) override {
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
  void adoptStaging(const at::Tensor& /*staging*/) override {}
  rails::Buffer sendBuffer(const at::Tensor& tensor) override {
    return hostBuffer(tensor);
  }
  rails::Buffer receiveBuffer(const at::Tensor& tensor) override {
    return hostBuffer(tensor);
  }
  Fence receivedFence(const rails::Buffer& /*received*/) override {
    return Fence();
  }
  int64_t minShardBytes() const override {
    return 1;
  }
};

} // namespace

rails::Buffer hostBuffer(const at::Tensor& tensor) {
  return rails::Buffer{
      tensor.data_ptr(),
      static_cast<size_t>(tensor.numel() * tensor.element_size()),
      c10::Device(c10::kCPU),
      std::nullopt};
}

std::unique_ptr<DeviceContext> makeCpuContext(LocalGroups groups) {
  return std::make_unique<CpuContext>(std::move(groups));
}

} // namespace fairring
