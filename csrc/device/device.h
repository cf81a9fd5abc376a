#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "device/shared_memory.h"
#include "rails/transport.h"

namespace fairring {

// The stages of a slice that do device work, in the order a slice goes
// through them. Each has one thread and, on CUDA, one stream of its own.
enum class Stage : int { kReduceScatter = 0, kReduce = 1, kAllGather = 2 };
constexpr int kStages = 3;
const char* stageName(Stage stage);

// What a fence is on one kind of device (a CUDA event, a position in an
// emulated stream); only that device's context looks inside.
struct FenceState {
  virtual ~FenceState() = default;
};

// A point in the device work of one stage, for another stage or the host to
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

// What runs the local steps over this machine's ranks, made and connected
// before the engine starts (fairring/_registration.py); nothing with one rank
// per machine. Either shared memory (CPU, where every local rank could map
// every other's segment), or a group per step, made by torch's own
// constructors: each step is fed by one stage thread, in slice order, so no
// two ranks can interleave their operations differently.
struct LocalGroups {
  c10::intrusive_ptr<c10d::Backend> reduceScatter;
  c10::intrusive_ptr<c10d::Backend> allGather;
  std::shared_ptr<SharedMemorySteps> sharedMemory;

  bool empty() const {
    return !sharedMemory && !reduceScatter && !allGather;
  }
};

// TensorPipe's GPUDirect channel has crashed on buffers under 32 bytes. Every
// CUDA engine keeps shards at least this long, GPUDirect or not, so that the
// plan never depends on what one rank's hardware offers.
constexpr int64_t kCudaMinShardBytes = 32;

// The seam between the engine and the device its tensors live on: everything
// that differs between the CPU and CUDA. The engine calls the same methods in
// the same places for both, and hands every piece of device work (copies,
// reductions, local steps, completion) to its stage through enqueue(); on
// the CPU most methods do nothing and enqueue() runs the work at once,
// because CPU work is finished when the host call that does it returns.
// Devices with streams (CUDA, and the emulated device the tests run) share
// one implementation of the ordering, StreamedContext (device/streamed.h).
//
// Threads: adoptInput and futureDevices run on the caller's thread; the
// methods marked "stage" on the stage thread of the Stage they name;
// receivedFence on the transport's thread; abort on any; join on the
// engine's owner, after its stage threads have returned.
class DeviceContext {
 public:
  using Clock = std::chrono::steady_clock;

  virtual ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  c10::Device device() const {
    return device_;
  }

  // -- Issue, on the caller's thread.

  // The engine will read `flat` (the caller's tensor, or its contiguous copy)
  // and write `flat` and `tensor` from its stages. Returns what the first
  // stage waits for before reading: the caller's work so far. Their memory is
  // not reused before the engine's work on it is done.
  virtual Fence adoptInput(const at::Tensor& flat, const at::Tensor& tensor) = 0;
  // The devices an op's future records its completion on; none on the CPU.
  virtual std::vector<c10::Device> futureDevices() const = 0;

  // -- Stage threads.

  // Stage: `work` runs on `stage`'s device queue, after everything enqueued
  // there before (at once on the CPU). It must not throw.
  virtual void enqueue(Stage stage, std::function<void()> work) = 0;
  // Stage: `stage`'s later device work waits for `fence`; the host does not.
  virtual void waitOnDevice(Stage stage, const Fence& fence) = 0;
  // Stage: where `stage`'s device work stands now.
  virtual Fence record(Stage stage) = 0;
  // Any thread: blocks until the work before `fence` is done, or returns
  // false as soon as `cancelled()` is true.
  virtual bool waitOnHost(
      const Fence& fence,
      const std::function<bool()>& cancelled) = 0;

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

  // -- Local steps (stage), over this machine's ranks; with one rank per
  // machine, plain copies. Ordered on the stage's stream on CUDA. Each gives
  // up at `deadline` (the op's), and throws at once after abort(). `key`
  // names the slice, the same on every local rank.

  // slot = `op` over local ranks r of rank r's part `localRank` of `input`,
  // split in as many equal parts. Through a group: an all-to-all into
  // `parts` ([localSize, slot], row 0 is `slot`), then a local combination
  // (Gloo's own reduce-scatter takes 2-3x as long on the same data).
  void localReduceScatter(
      at::Tensor& slot,
      at::Tensor& parts,
      at::Tensor& input,
      c10d::ReduceOp::RedOpType op,
      const LocalStepKey& key,
      Clock::time_point deadline);
  // output = every rank's `part`, in local-rank order.
  void localAllGather(
      at::Tensor& output,
      at::Tensor& part,
      const LocalStepKey& key,
      Clock::time_point deadline);

  // What runs the local steps: "shared memory", the groups' backend name
  // ("gloo", "nccl"), or "none" with one rank per machine.
  std::string localStepsName() const;

  // Ends the device work in flight: the local groups are aborted (on a
  // thread of this context's: NCCL's abort may block, and the caller may be
  // the transport's thread); a queue waiting for a Gloo step (which cannot
  // be aborted) stops waiting; queued work is dropped. Any thread; once.
  void abort();
  // After abort() and once the engine's stage threads have returned: the
  // device's own threads (an emulated device's streams, the aborting
  // thread) are joined, so no enqueued work runs after this.
  void join();

 protected:
  DeviceContext(c10::Device device, LocalGroups groups);

  // What abort() and join() do besides the local steps.
  virtual void abortQueues() {}
  virtual void joinQueues() {}

  // Waits for a local step's Work from `group`, issued synchronously
  // (asyncOp=false). NCCL queued its kernel on the current stream (the
  // stage's) and may return no Work: the host does not wait; abort() ends a
  // step that never finishes. Any other group: the host waits until the step
  // is done or abort() is called.
  void waitForLocalStep(
      const c10d::Backend& group,
      const c10::intrusive_ptr<c10d::Work>& work);

 private:
  // Shared with the callbacks of local steps, which may outlive this.
  struct LocalWaits {
    std::mutex mutex;
    std::condition_variable changed;
    bool aborted = false;
  };

  const c10::Device device_;
  LocalGroups groups_;
  const std::shared_ptr<LocalWaits> localWaits_;
  std::atomic<bool> aborted_{false};
  // A stage thread stopped waiting for a Gloo step that still runs.
  std::atomic<bool> abandonedLocalStep_{false};
  std::thread aborting_; // runs the groups' abort(); joined by join()
};

// The rails' view of a CPU tensor's bytes.
rails::Buffer hostBuffer(const at::Tensor& tensor);

std::unique_ptr<DeviceContext> makeCpuContext(LocalGroups groups);
// Throws where the CUDA path is not built (device/cuda_none.cpp).
std::unique_ptr<DeviceContext> makeCudaContext(
    c10::Device device,
    LocalGroups groups);

// Whether the caller's current stream on `device` is being captured into a
// CUDA graph (false where the CUDA path is not built).
bool cudaGraphCaptureUnderway(c10::Device device);

// Versions of the CUDA runtime compiled against, if the CUDA path is built.
bool cudaPathBuilt();
std::string cudaRuntimeVersion();

} // namespace fairring
