#include "device/device.h"

#include <c10/util/Exception.h>

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

// Both local steps end with the Work's wait(): Gloo's blocks the host until
// the step is done; NCCL's makes the current (stage) stream wait for it.
void DeviceContext::localAllToAll(at::Tensor& parts, at::Tensor& input) {
  if (!groups_.reduceScatter) {
    parts.view({-1}).copy_(input);
    return;
  }
  std::vector<int64_t> equalSplits;
  // The name both torch 2.11 and 2.15 have (2.15 also calls it all_to_all_single).
  groups_.reduceScatter->alltoall_base(parts, input, equalSplits, equalSplits)
      ->wait();
}

void DeviceContext::localAllGather(at::Tensor& output, at::Tensor& part) {
  if (!groups_.allGather) {
    output.copy_(part);
    return;
  }
  groups_.allGather->_allgather_base(output, part)->wait();
}

void DeviceContext::abort() {
  if (aborted_.exchange(true)) {
    return;
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
