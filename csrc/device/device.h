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
#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "device/shared_memory.h"
#include "rails/transport.h"

namespace fairring {

// The stages of a slice that do device work, in the order a slice goes
// through them. Each has one thread and, on CUDA, one stream of its own.
enum class Stage : int { kReduceScatter = 0, kReduce = 1, kAllGather = 2 };
constexpr int kStages = 3;
const char* stageName(Stage stage);

// A point in the device work of one stage, for another stage or the host to
// wait on. Empty on the CPU, where work is done when the host call returns.
class Fence {
 public:
  Fence() = default;
  explicit Fence(std::shared_ptr<const c10::Event> event)
      : event_(std::move(event)) {}
  const c10::Event* event() const {
    return event_.get();
  }

 private:
  std::shared_ptr<const c10::Event> event_;
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
// the same places for both; on the CPU most of them do nothing, because CPU
// work is finished when the host call that does it returns.
//
// Threads: adoptInput and futureDevices run on the caller's thread; runStage
// is each stage thread's body, and the methods marked "stage" run on it;
// receivedFence runs on the transport's thread; abort on any.
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

  // Runs `loop` as the body of stage `stage`'s thread.
  virtual void runStage(Stage stage, const std::function<void()>& loop) = 0;
  // Stage: this stage's later device work waits for `fence`; the host does not.
  virtual void waitOnDevice(const Fence& fence) = 0;
  // Stage: where this stage's device work stands now.
  virtual Fence record() = 0;
  // Any thread: blocks until the work before `fence` is done, or returns
  // false as soon as `cancelled()` is true.
  virtual bool waitOnHost(
      const Fence& fence,
      const std::function<bool()>& cancelled) = 0;

  // -- Memory.

  // Where staging memory is allocated.
  virtual at::TensorOptions memoryOptions() const = 0;
  // `tensor`'s memory is not reused before every stage's and the rails' work
  // queued so far has finished, without waiting for it now.
  virtual void keepAlive(const at::Tensor& tensor) = 0;
  // The rails' view of `tensor` for a send (stage, after waitOnHost of the
  // fence that produced it) or a receive. CUDA: on streams that only the
  // rails use (see docs/design.md, "CUDA").
  virtual rails::Buffer sendBuffer(const at::Tensor& tensor) = 0;
  virtual rails::Buffer receiveBuffer(const at::Tensor& tensor) = 0;
  // Transport thread, when a receive completed: what consumers wait for.
  virtual Fence receivedFence() = 0;
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

  // Ends the local steps in flight: NCCL's are aborted; a stage thread
  // waiting for a Gloo step (which cannot be aborted) stops waiting. Any
  // thread; once.
  void abort();

 protected:
  DeviceContext(c10::Device device, LocalGroups groups);

  // Waits for a local step's Work as this device needs (stage). By default
  // the host waits until it is done or abort() is called.
  virtual void waitForLocalStep(const c10::intrusive_ptr<c10d::Work>& work);

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
};

std::unique_ptr<DeviceContext> makeCpuContext(LocalGroups groups);
// Throws where the CUDA path is not built (device/cuda_none.cpp).
std::unique_ptr<DeviceContext> makeCudaContext(
    c10::Device device,
    LocalGroups groups);

// Versions of the CUDA runtime compiled against, if the CUDA path is built.
bool cudaPathBuilt();
std::string cudaRuntimeVersion();

} // namespace fairring
