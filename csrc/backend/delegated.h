#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace fairring {

// The collectives fairring delegates to Gloo, watched so that a failure of
// the group (the engine's, which names the rank to blame: a dead or silent
// peer, ranks that issued different collectives) also fails the ones still
// pending, at once and with that cause, rather than leaving them to Gloo's
// timeout and its message, which names no rank. Once the group has failed,
// later collectives are refused before they reach the delegate, whose ranks
// may no longer agree on what comes next.
//
// Gloo's own operation goes on until Gloo ends it; its output tensors are
// undefined, as after any failed collective. NCCL's operations run on the
// GPU and are not watched: the group's failure aborts NCCL's group, which
// ends them (Backend::onEngineFailed, docs/design.md).
class DelegatedWorks {
 public:
  // `prefix` starts every error ("fairring: rank 3: ").
  explicit DelegatedWorks(std::string prefix) : prefix_(std::move(prefix)) {}
  ~DelegatedWorks(); // joins the thread that fails pending works

  DelegatedWorks(const DelegatedWorks&) = delete;
  DelegatedWorks& operator=(const DelegatedWorks&) = delete;

  // A Work that completes as `inner` does, or fails with the group's failure
  // if that comes first; `inner` itself where it has no Future to follow.
  c10::intrusive_ptr<c10d::Work> watch(
      const c10::intrusive_ptr<c10d::Work>& inner,
      c10d::OpType opType,
      uint64_t seq,
      const std::vector<at::Tensor>& inputs);

  // The group failed: pending works fail with `cause`, then `andThen` runs
  // (if any), on a thread of this object's (their callbacks must not run on
  // the caller's, an engine or transport thread). Later calls do nothing.
  void fail(const std::string& cause, std::function<void()> andThen = {});

  // A test's negative control: with false, a Gloo collective's Work that
  // has no future is handed out as Gloo made it, never completed and run
  // again by every wait. Process-wide; never set outside tests.
  static void setCompletedByWaitForTests(bool enabled);

  // The cause, once failed; else empty.
  std::string failure() const;

  // How the first watched work the delegate itself failed ended: TIMEOUT
  // where Gloo says it timed out, else COMM_ERROR; SUCCESS while none has.
  c10d::ErrorType ownError() const {
    return ownError_->load();
  }

 private:
  struct Watched;

  const std::string prefix_;
  // Shared with the watched works, which may complete after this object.
  const std::shared_ptr<std::atomic<c10d::ErrorType>> ownError_ =
      std::make_shared<std::atomic<c10d::ErrorType>>(c10d::ErrorType::SUCCESS);
  mutable std::mutex mutex_;
  std::string failure_;
  std::vector<std::weak_ptr<Watched>> pending_; // may hold completed ones
  size_t pruneAt_ = 64;
  std::thread failing_; // runs fail()'s callbacks; joined by the destructor
};

// Whether fairring asks its delegates for a Work (askingForWork): always, but
// in a test's negative control. Process-wide.
bool delegatesAskedForWork();
void setDelegatesAskedForWorkForTests(bool enabled);

// The options fairring hands a delegate: the caller's, asking for a Work.
// Since torch 2.8 ProcessGroupNCCL returns none for a synchronous operation
// (asyncOp false) and queues its kernel on the caller's current stream; but
// fairring follows every operation it hands on (a launch in its turn runs on
// a stage thread after the caller has returned; the memory order, the hooks
// and fairring's own Work wait on it). NCCL's asynchronous form keeps the
// caller's order as well: its stream waits for the caller's at launch, and
// its Work's wait(), which torch's Python calls for a synchronous operation,
// makes the caller's current stream wait for it (docs/design.md,
// "ProcessGroupNCCL's contract").
template <typename Options>
Options askingForWork(const Options& opts) {
  Options asked = opts;
  asked.asyncOp = asked.asyncOp || delegatesAskedForWork();
  return asked;
}

// Throws, saying what to change, where Gloo cannot run `op` on `tensors`.
void checkGlooReduction(
    const char* opName,
    const c10d::ReduceOp& op,
    const std::vector<at::Tensor>& tensors);

} // namespace fairring
