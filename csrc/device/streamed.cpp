#include "device/streamed.h"

#include <chrono>
#include <thread>

namespace fairring {

static_assert(
    StreamPolicy::kInputStream == static_cast<int>(Queue::kInput) &&
        StreamPolicy::kReduceStream == static_cast<int>(Queue::kReduce) &&
        StreamPolicy::kOutputStream == static_cast<int>(Queue::kOutput),
    "each queue's stream is numbered as the queue");

StreamedContext::StreamedContext(std::unique_ptr<StreamPolicy> policy)
    : DeviceContext(policy->device()), policy_(std::move(policy)) {}

StreamedContext::~StreamedContext() {
  // The policy's threads run work that uses this context: joined first.
  abort();
  join();
}

Fence StreamedContext::adoptInput(
    const at::Tensor& elements, const at::Tensor& tensor) {
  Fence callerWork = policy_->recordCaller();
  // The input queue reads `elements`; the output queue writes it and, when
  // it is a copy, `tensor`.
  policy_->recordUse(elements, streamOf(Queue::kInput));
  policy_->recordUse(elements, streamOf(Queue::kOutput));
  policy_->recordUse(tensor, streamOf(Queue::kOutput));
  return callerWork;
}

std::vector<c10::Device> StreamedContext::futureDevices() const {
  return policy_->futureDevices();
}

void StreamedContext::enqueue(Queue queue, std::function<void()> work) {
  policy_->issue(streamOf(queue), queue, std::move(work));
}

void StreamedContext::waitOnDevice(Queue queue, const Fence& fence) {
  if (fence.state() != nullptr) {
    policy_->wait(streamOf(queue), fence);
  }
}

Fence StreamedContext::record(Queue queue) {
  return policy_->record(streamOf(queue));
}

bool StreamedContext::fenceDone(const Fence& fence) {
  return policy_->query(fence);
}

bool StreamedContext::waitOnHost(
    const Fence& fence, const std::function<bool()>& cancelled) {
  // Polled rather than synchronised, so that an abort is never stuck behind
  // a device that will not finish.
  while (!policy_->query(fence)) {
    if (cancelled()) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return !cancelled();
}

at::TensorOptions StreamedContext::memoryOptions() const {
  return at::TensorOptions().device(device());
}

void StreamedContext::adoptStaging(const at::Tensor& staging) {
  // The allocator may have handed out memory that the caller's stream still
  // uses: every stream that touches staging starts after the caller's work.
  const Fence callerWork = policy_->recordCaller();
  for (int stream = 0; stream < StreamPolicy::kStreams; ++stream) {
    policy_->wait(stream, callerWork);
    policy_->recordUse(staging, stream);
  }
}

rails::Buffer StreamedContext::sendBuffer(const at::Tensor& tensor) {
  return policy_->sendBuffer(tensor);
}

rails::Buffer StreamedContext::receiveBuffer(const at::Tensor& tensor) {
  return policy_->receiveBuffer(tensor);
}

bool StreamedContext::launchesAhead() const {
  return policy_->launchesAhead();
}

at::TensorOptions StreamedContext::railsMemoryOptions() const {
  return launchesAhead() ? policy_->railsMemoryOptions() : memoryOptions();
}

void StreamedContext::waitForSignal(
    Queue queue, Signal signal, uint32_t ticket) {
  policy_->waitForSignal(streamOf(queue), signal, ticket);
}

void StreamedContext::raiseSignal(Signal signal, uint32_t ticket) {
  policy_->raiseSignal(signal, ticket);
}

void StreamedContext::openSignals() {
  policy_->openSignals();
}

void StreamedContext::railsCopy(
    Queue queue, const at::Tensor& to, const at::Tensor& from, bool received) {
  const auto delay =
      received ? policy_->receivedCopyDelay() : std::chrono::milliseconds(0);
  policy_->issue(streamOf(queue), queue, [to, from, delay] {
    to.copy_(from, /*non_blocking=*/true);
    // A slow copy reads its source from the start: what it read before
    // the bytes came is caught, as a DMA's would be.
    if (delay.count() > 0) {
      std::this_thread::sleep_for(delay);
    }
  });
}

std::function<bool(const Fence&)> StreamedContext::callerWaiter() {
  return policy_->callerWaiter();
}

Fence StreamedContext::receivedFence(const rails::Buffer& received) {
  return policy_->received(received);
}

int64_t StreamedContext::minShardBytes() const {
  return policy_->minShardBytes();
}

bool StreamedContext::mayRunInLaunchOrder() const {
  return policy_->mayRunInLaunchOrder();
}

void StreamedContext::abort() {
  policy_->abort();
}

void StreamedContext::join() {
  policy_->join();
}

} // namespace fairring
