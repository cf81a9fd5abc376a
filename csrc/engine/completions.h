#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace fairring {

// Where the futures an engine returns complete, so that their callbacks
// (a Future's then(), DDP's comm hooks, wait() with a timeout) run on threads
// of their own rather than on a stage thread or the transport's loop: a
// callback may block, even on another all-reduce of the same engine.
//
// A worker runs each completion; a completion queued while every worker is
// busy starts another (up to kMaxWorkers), so a blocked callback never holds
// up the next completion. Workers beyond the first leave after kIdleExit
// without work (the next post() joins them). The destructor runs what is
// queued, then joins them all. Owned by a shared_ptr: a relay holds it until
// its inner future completes, which for a delegate's may be after the engine.
class Completions : public std::enable_shared_from_this<Completions> {
 public:
  static constexpr size_t kMaxWorkers = 32;
  static constexpr std::chrono::seconds kIdleExit{2};

  explicit Completions(c10::Device device) : device_(device) {}
  ~Completions();

  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;

  // A future that completes as `inner` did, on a worker. With CUDA, its
  // events follow `inner`'s, recorded on a stream from the pool.
  c10::intrusive_ptr<c10::ivalue::Future> relay(
      const c10::intrusive_ptr<c10::ivalue::Future>& inner);
  // The same into `outer`, made beforehand (its consumers may have chained
  // on it already), whose devices hold `inner`'s.
  void relayInto(
      const c10::intrusive_ptr<c10::ivalue::Future>& inner,
      c10::intrusive_ptr<c10::ivalue::Future> outer);

  // `outer` completes, on a worker, once `work` (a Work without a future:
  // some of Gloo's) has been waited for there: with its result, or its error.
  void relayWaitInto(
      c10::intrusive_ptr<c10d::Work> work,
      c10::intrusive_ptr<c10::ivalue::Future> outer);

  size_t workers() const;

 private:
  void post(std::function<void()> task);
  void work(bool first);

  const c10::Device device_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  size_t idle_ = 0;
  size_t running_ = 0; // workers started and not yet left
  bool stopping_ = false;
  std::vector<std::thread> workers_; // joined once left, or by the destructor
  std::vector<std::thread::id> left_; // workers that left their loop
};

} // namespace fairring
