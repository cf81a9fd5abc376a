#include <torch_headers.h> // first: the precompiled torch headers

#include "testing/endpoint.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include "rails/tensorpipe/mesh.h"

namespace fairring::rails {

void Transfer::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  TORCH_CHECK(
      done_.wait_for(lock, timeout, [this] { return finished_; }),
      "fairring: rails transfer not done within ",
      timeout.count(),
      " ms");
  TORCH_CHECK(error_.empty(), "fairring: ", error_);
}

void Transfer::finish(const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) {
      return;
    }
    finished_ = true;
    error_ = error;
  }
  done_.notify_all();
}

Endpoint::Endpoint(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::string& storePrefix,
    const Topology& topology,
    c10::Device device,
    const RailsNetwork& network,
    std::chrono::milliseconds timeout)
    : device_(device) {
  TORCH_CHECK(
      device.is_cpu() || (device.is_cuda() && device.has_index()),
      "fairring: a rails endpoint moves CPU or indexed CUDA tensors, not ",
      device);
  mesh_ = std::make_unique<TensorpipeMesh>(
      MeshSite{store, storePrefix, topology, network, device, timeout});
  lanes_ = std::make_unique<Lanes>(
      *mesh_,
      [this](int, bool, const std::string& message) { failAll(message); });
}

void Endpoint::switchRail(
    int machine, uint64_t generation, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto never = [] { return false; };
  lanes_->suspend(machine);
  TORCH_CHECK(
      lanes_->quiesce(machine, deadline, never),
      "fairring: the rails to machine ",
      machine,
      " did not quiesce for the switch");
  mesh_->detach(machine);
  const ReceivedCounts peerReceived = mesh_->reconnect(
      machine,
      mesh_->interfaceName(),
      generation,
      lanes_->received(machine),
      deadline,
      never);
  lanes_->resume(machine, peerReceived);
}

Endpoint::~Endpoint() {
  mesh_->shutdown(); // no callback runs after this
}

std::shared_ptr<Transfer> Endpoint::track(const at::Tensor& tensor) {
  TORCH_CHECK(
      tensor.device() == device_ && tensor.is_contiguous(),
      "fairring: this endpoint moves contiguous tensors on ",
      device_,
      ", not a ",
      tensor.is_contiguous() ? "" : "non-contiguous ",
      "tensor on ",
      tensor.device());
  auto transfer = std::make_shared<Transfer>(tensor);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_.empty()) {
    transfer->finish(error_);
  } else {
    std::erase_if(pending_, [](const auto& weak) { return weak.expired(); });
    pending_.push_back(transfer);
  }
  return transfer;
}

Buffer Endpoint::buffer(const at::Tensor& tensor) const {
  Buffer result{
      tensor.data_ptr(),
      static_cast<size_t>(tensor.numel() * tensor.element_size()),
      device_,
      std::nullopt};
  if (device_.is_cuda()) {
    result.stream =
        c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
  }
  return result;
}

std::shared_ptr<Transfer> Endpoint::send(
    int machine, Lane lane, std::string tag, const at::Tensor& tensor) {
  auto transfer = track(tensor);
  lanes_->send(
      machine,
      lane,
      std::move(tag),
      buffer(tensor),
      "a message",
      [transfer] { transfer->finish(""); },
      [] {});
  return transfer;
}

std::shared_ptr<Transfer> Endpoint::expect(
    int machine, Lane lane, std::string tag, const at::Tensor& tensor) {
  auto transfer = track(tensor);
  lanes_->expect(
      machine, lane, {std::move(tag), buffer(tensor), "a message", [transfer] {
                        transfer->finish("");
                      }});
  return transfer;
}

void Endpoint::close() {
  lanes_->close("the endpoint was closed");
}

void Endpoint::failAll(const std::string& message) {
  std::vector<std::weak_ptr<Transfer>> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_.empty()) {
      error_ = message;
    }
    pending.swap(pending_);
  }
  for (const auto& weak : pending) {
    if (auto transfer = weak.lock()) {
      transfer->finish(message);
    }
  }
}

} // namespace fairring::rails
