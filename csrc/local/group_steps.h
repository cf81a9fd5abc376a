#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "local/local_steps.h"

namespace fairring {

// The local steps through a group per step (Gloo on CPU, NCCL on CUDA),
// made by torch's own constructors: each step is fed by one stage thread, in
// slice order, so no two ranks can interleave their operations differently.
// The reduce-scatter is an all-to-all into `parts` and a local combination
// (Gloo's own reduce-scatter takes 2-3x as long on the same data).
//
// Steps are issued synchronously (asyncOp=false). NCCL queues its kernel on
// the current stream (the stage's) and may return no Work: the host does not
// wait, and abort() ends a step that never finishes. Any other group: the
// host waits until the step is done or abort() is called.
//
// Stopping: abort() aborts both groups at once, each on a thread of this
// object's (NCCL's abort may block, even while the other group's kernel
// spins, and the caller may be the transport's thread); close() shuts NCCL
// groups down gracefully the same way. join() waits for those threads at
// most kStopWait, then leaves them to finish on their own: shutdown never
// hangs on a group.
class GroupSteps final : public LocalSteps {
 public:
  // How long join() waits for the groups' abort or shutdown.
  static constexpr std::chrono::seconds kStopWait{10};
  // What a NCCL group's timeout adds to the engine's: its watchdog, which
  // ends the whole process, then fires after the engine's has failed the op
  // with the cause it knows (Engine::kSettleGrace, twice, and some to spare).
  static constexpr std::chrono::seconds kNcclStepLag{10};

  GroupSteps(
      c10::intrusive_ptr<c10d::Backend> reduceScatter,
      c10::intrusive_ptr<c10d::Backend> allGather);
  ~GroupSteps() override;
  GroupSteps(const GroupSteps&) = delete;
  GroupSteps& operator=(const GroupSteps&) = delete;

  void reduceScatter(
      at::Tensor& slot,
      at::Tensor& parts,
      const at::Tensor& input,
      c10d::ReduceOp::RedOpType op,
      const LocalStepKey& key,
      Clock::time_point deadline) override;
  void allGather(
      at::Tensor& output,
      const at::Tensor& part,
      const LocalStepKey& key,
      Clock::time_point deadline) override;
  std::string name() const override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  // A stage waiting for a Gloo step (which cannot be aborted) stops waiting.
  void abort() override;
  void close() override;
  void join() override;

 private:
  // Shared with the callbacks of steps and the stopping threads, which may
  // outlive this.
  struct Waits {
    std::mutex mutex;
    std::condition_variable changed;
    bool aborted = false;
    int stopsRunning = 0; // the groups' abort() or shutdown() calls running
  };

  bool isNccl() const;
  void waitForStep(
      const c10d::Backend& group, const c10::intrusive_ptr<c10d::Work>& work);
  // Runs `stop` on each group at once, on threads of this object's.
  void stopGroups(void (c10d::Backend::*stop)());

  c10::intrusive_ptr<c10d::Backend> reduceScatter_;
  c10::intrusive_ptr<c10d::Backend> allGather_;
  const std::shared_ptr<Waits> waits_;
  std::atomic<bool> stopped_{false}; // abort() or close() was called
  // A stage thread stopped waiting for a Gloo step that still runs.
  std::atomic<bool> abandonedStep_{false};
  // Run the groups' abort() or shutdown(); joined (or, past kStopWait,
  // detached) by join(). Each owns references to what it uses. Guarded by
  // waits_->mutex.
  std::vector<std::thread> stopping_;
};

} // namespace fairring
