#include "device/streamed.h"

#include <chrono>
#include <thread>

namespace fairring {

static_assert(
    StreamPolicy::kReduceScatterStream ==
            static_cast<int>(Stage::kReduceScatter) &&
        StreamPolicy::kReduceStream == static_cast<int>(Stage::kReduce) &&
        StreamPolicy::kAllGatherStream == static_cast<int>(Stage::kAllGather),
    "each stage's stream is numbered as the stage");

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
  // The reduce-scatter stage reads `elements`; the all-gather stage writes it
  // and, when it is a copy, `tensor`.
  policy_->recordUse(elements, streamOf(Stage::kReduceScatter));
  policy_->recordUse(elements, streamOf(Stage::kAllGather));
  policy_->recordUse(tensor, streamOf(Stage::kAllGather));
  return callerWork;
}

std::vector<c10::Device> StreamedContext::futureDevices() const {
  return policy_->futureDevices();
}

void StreamedContext::enqueue(Stage stage, std::function<void()> work) {
  policy_->issue(streamOf(stage), stage, std::move(work));
}

void StreamedContext::waitOnDevice(Stage stage, const Fence& fence) {
  if (fence.state() != nullptr) {
    policy_->wait(streamOf(stage), fence);
  }
}

Fence StreamedContext::record(Stage stage) {
  return policy_->record(streamOf(stage));
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
