#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "rails/transport.h"

namespace fairring {

// The device's queues of work, one for each engine stage that does device
// work (engine/stage.h maps the stages onto them). Work on one queue runs in
// the order it was enqueued; work on different queues may overlap. kInput's
// work reads the caller's tensor, kOutput's writes the result into it.
enum class Queue : int { kInput = 0, kReduce = 1, kOutput = 2 };
constexpr int kQueues = 3;

// What a fence is on one kind of device (a CUDA event, a position in an
// emulated stream); only that device's context looks inside.
struct FenceState {
  virtual ~FenceState() = default;
};

// A point in the device work of one queue, for another queue or the host to
// wait on. Empty on the CPU, where work is done when the host call returns.
class Fence {
 public:
  Fence() = default;
  explicit Fence(std::shared_ptr<const FenceState> state)
      : state_(std::move(state)) {}
  const FenceState* state() const {
    return state_.get();
  }

 private:
  std::shared_ptr<const FenceState> state_;
};

// Makes the caller's current stream wait on the device for an op; false
// where it need not or could not (Engine::Started).
using CallerHold = std::function<bool()>;

// What the host tells a device that launches ahead, per slice ticket
// (DeviceContext::raiseSignal): every machine's shards arrived, every
// reduced shard arrived, every send is done with the rails' memory.
enum class Signal : int {
  kShardsArrived = 0,
  kReducedArrived = 1,
  kSendsDone = 2
};
constexpr int kSignals = 3;

// Whether a signal at `released` covers `ticket`: the comparison CUDA's
// cuStreamWaitValue32 makes with CU_STREAM_WAIT_VALUE_GEQ, which wraps.
constexpr bool ticketReleased(uint32_t released, uint32_t ticket) {
  return static_cast<int32_t>(released - ticket) >= 0;
}

// The later of two tickets in that order: what a second raise writes, so
// that it never takes an earlier one back.
constexpr uint32_t laterTicket(uint32_t earlier, uint32_t ticket) {
  return ticketReleased(earlier, ticket) ? earlier : ticket;
}
static_assert(
    laterTicket(5, 3) == 5 && laterTicket(3, 5) == 5 &&
        laterTicket(0xFFFFFFFFu, 1) == 1,
    "tickets compare as cuStreamWaitValue32 does, across the wrap");

// TensorPipe's GPUDirect channel has crashed on buffers under 32 bytes. Every
// CUDA engine keeps shards at least this long, GPUDirect or not, so that the
// plan never depends on what one rank's hardware offers.
constexpr int64_t kCudaMinShardBytes = 32;

// The seam between the engine and the device its tensors live on: everything
// that differs between the CPU and CUDA. The engine calls the same methods in
// the same places for both, and hands every piece of device work (copies,
// reductions, the local steps of local/, completion) to its stage through
// enqueue(); on the CPU most methods do nothing and enqueue() runs the work at
// once, because CPU work is finished when the host call that does it returns.
// Devices with streams (CUDA, and the emulated device the tests run) share
// one implementation of the ordering, StreamedContext (device/streamed.h).
//
// Threads: adoptInput and futureDevices run on the caller's thread; the
// methods marked "stage" on the engine's stage thread that feeds the Queue
// they name;
// receivedFence on the transport's thread; abort on any; join on the
// engine's owner, after its stage threads have returned.
class DeviceContext {
 public:
  using Clock = std::chrono::steady_clock;

  virtual ~DeviceContext() = default;
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  c10::Device device() const {
    return device_;
  }

  // -- Issue, on the caller's thread.

  // The engine will read `elements` (the caller's tensor, or its contiguous
  // copy) and write `elements` and `tensor` from its stages. Returns what the
  // first stage waits for before reading: the caller's work so far. Their
  // memory is not reused before the engine's work on it is done.
  virtual Fence adoptInput(
      const at::Tensor& elements, const at::Tensor& tensor) = 0;
  // The devices an op's future records its completion on; none on the CPU.
  virtual std::vector<c10::Device> futureDevices() const = 0;

  // -- Stage threads.

  // Stage: `work` runs on `queue`, after everything enqueued there before
  // (at once on the CPU). It must not throw.
  virtual void enqueue(Queue queue, std::function<void()> work) = 0;
  // Stage: `queue`'s later work waits for `fence`; the host does not.
  virtual void waitOnDevice(Queue queue, const Fence& fence) = 0;
  // Stage: where `queue`'s work stands now.
  virtual Fence record(Queue queue) = 0;
  // Any thread: whether the work before `fence` is done, now.
  virtual bool fenceDone(const Fence& /*fence*/) {
    return true;
  }
  // Any thread: blocks until the work before `fence` is done, or returns
  // false as soon as `cancelled()` is true.
  virtual bool waitOnHost(
      const Fence& fence, const std::function<bool()>& cancelled) = 0;

  // -- Launching ahead of the network (docs/design.md, "The host never
  // waits"). A device that launches ahead has every piece of an op's device
  // work launched without the host waiting for the rails: the rails move
  // bytes through host memory the device reaches (railsMemoryOptions), the
  // engine launches the copies to and from it, and work that needs bytes
  // from the rails waits on the device for a signal the host raises. A
  // signal is a 32-bit count of slice tickets, raised in increasing order
  // (cyclically, as ticketReleased compares); a wait for ticket t passes
  // once the signal reached t.

  virtual bool launchesAhead() const {
    return false;
  }
  // Where the rails' copy of staging lives on a device that launches ahead.
  virtual at::TensorOptions railsMemoryOptions() const {
    return memoryOptions();
  }
  // Stage: `queue`'s later work waits on the device until `signal` reached
  // `ticket`; the host does not wait.
  virtual void waitForSignal(
      Queue /*queue*/, Signal /*signal*/, uint32_t /*ticket*/) {}
  // Any thread: the host raises `signal` to `ticket` (never lowers it).
  virtual void raiseSignal(Signal /*signal*/, uint32_t /*ticket*/) {}
  // Any thread, on a failure: every wait for a signal passes from now on,
  // so the device runs out the work it was given (on what the memory holds)
  // and no stream stays held.
  virtual void openSignals() {}
  // Stage: `to` = `from` on `queue`, a copy between staging and its rails
  // copy; `received`: the bytes came from the rails.
  virtual void railsCopy(
      Queue queue,
      const at::Tensor& to,
      const at::Tensor& from,
      bool received) {
    enqueue(queue, [to, from] { to.copy_(from, /*non_blocking=*/true); });
  }
  // What makes the caller's current stream wait on the device for a fence
  // of this device's, to be called on the caller's thread when an op's Work
  // is waited on; it returns false, doing nothing, where it cannot (that
  // stream is being captured). It outlives the context: a Work may be waited
  // on after its engine is gone. Null where the host waits instead.
  virtual std::function<bool(const Fence&)> callerWaiter() {
    return nullptr;
  }

  // -- Memory.

  // Where staging memory is allocated.
  virtual at::TensorOptions memoryOptions() const = 0;
  // `staging`, allocated on the caller's thread, is used by every stage and
  // the rails: their work waits for the caller's work so far (the memory's
  // previous users), and the memory is not reused before their work queued
  // so far has finished, without waiting for it now.
  virtual void adoptStaging(const at::Tensor& staging) = 0;
  // The rails' view of `tensor` for a send (stage, after waitOnHost of the
  // fence that produced it) or a receive. CUDA: on streams that only the
  // rails use (see docs/design.md, "CUDA").
  virtual rails::Buffer sendBuffer(const at::Tensor& tensor) = 0;
  virtual rails::Buffer receiveBuffer(const at::Tensor& tensor) = 0;
  // Transport thread, when the receive into `received` (a receiveBuffer)
  // completed: what consumers of its bytes wait for.
  virtual Fence receivedFence(const rails::Buffer& received) = 0;
  // The smallest shard the rails may carry: all ranks derive the same plans
  // from it, as it depends on the device type only.
  virtual int64_t minShardBytes() const = 0;
  // Whether the device may run the work of all its streams in the order it
  // was launched (CUDA: with CUDA_DEVICE_MAX_CONNECTIONS=1, under MPS, where
  // streams share a hardware queue), so that the engine must launch its
  // local steps in one order on every rank (engine/launch_order.h). Not the
  // CPU's, whose local steps block their thread rather than a queue.
  virtual bool mayRunInLaunchOrder() const {
    return false;
  }

  // Ends the device work in flight where the device can: the emulated
  // device drops its queued work. CUDA cannot take back launched work: its
  // local steps end with their groups' abort, the rest runs out on streams
  // nothing else uses, and staging stays alive until it has (adoptStaging).
  // Any thread; idempotent.
  virtual void abort() {}
  // After abort() and once the engine's stage threads have returned: the
  // device's own threads (an emulated device's streams) are joined, so no
  // enqueued work runs after this.
  virtual void join() {}

 protected:
  explicit DeviceContext(c10::Device device) : device_(device) {}

 private:
  const c10::Device device_;
};

// The rails' view of a CPU tensor's bytes.
rails::Buffer hostBuffer(const at::Tensor& tensor);

std::unique_ptr<DeviceContext> makeCpuContext();
// Throws where the CUDA path is not built (device/cuda_none.cpp).
// `highPriority`: its streams take the device's greatest priority.
// `streamHold`: it launches ahead, and a wait on its ops holds the caller's
// stream, not the host (Config::cudaStreamHold).
std::unique_ptr<DeviceContext> makeCudaContext(
    c10::Device device, bool highPriority, bool streamHold);

// Whether the caller's current stream on `device` (a CUDA device) is being
// captured into a CUDA graph (false where the CUDA path is not built).
// Callers ask graphCaptureUnderway() (device/capture.h), which also knows the
// tests' model of capture.
bool cudaGraphCaptureUnderway(c10::Device device);

// The memory in use on `device` (a CUDA device), by every user of the
// device, as CUDA reports it (cudaMemGetInfo); -1 where the CUDA path is not
// built.
int64_t cudaMemoryInUse(c10::Device device);

// Versions of the CUDA runtime compiled against, if the CUDA path is built.
bool cudaPathBuilt();
std::string cudaRuntimeVersion();

} // namespace fairring
