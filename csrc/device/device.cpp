#include "device/device.h"

namespace fairring {

namespace {

// The CPU: work is done when the call that does it returns, so there is
// nothing to order, record or keep alive.
class CpuContext final : public DeviceContext {
 public:
  CpuContext() : DeviceContext(c10::Device(c10::kCPU)) {}

  Fence adoptInput(
      const at::Tensor& /*elements*/, const at::Tensor& /*tensor*/) override {
    return Fence();
  }
  std::vector<c10::Device> futureDevices() const override {
    return {};
  }
  void enqueue(Queue /*queue*/, std::function<void()> work) override {
    work();
  }
  void waitOnDevice(Queue /*queue*/, const Fence& /*fence*/) override {}
  Fence record(Queue /*queue*/) override {
    return Fence();
  }
  bool waitOnHost(
      const Fence& /*fence*/, const std::function<bool()>& cancelled) override {
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

std::unique_ptr<DeviceContext> makeCpuContext() {
  return std::make_unique<CpuContext>();
}

} // namespace fairring
