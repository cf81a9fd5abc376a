#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

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
class GroupSteps final : public LocalSteps {
 public:
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
  // The groups are aborted on a thread of this object's: NCCL's abort may
  // block, and the caller may be the transport's thread. A stage waiting for
  // a Gloo step (which cannot be aborted) stops waiting.
  void abort() override;
  void join() override;

 private:
  // Shared with the callbacks of steps, which may outlive this.
  struct Waits {
    std::mutex mutex;
    std::condition_variable changed;
    bool aborted = false;
  };

  void waitForStep(
      const c10d::Backend& group,
      const c10::intrusive_ptr<c10d::Work>& work);

  c10::intrusive_ptr<c10d::Backend> reduceScatter_;
  c10::intrusive_ptr<c10d::Backend> allGather_;
  const std::shared_ptr<Waits> waits_;
  std::atomic<bool> aborted_{false};
  // A stage thread stopped waiting for a Gloo step that still runs.
  std::atomic<bool> abandonedStep_{false};
  std::thread aborting_; // runs the groups' abort(); joined by join()
};

} // namespace fairring
