#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

// torch's completion and abort hooks (the flight recorder's way of learning
// that a backend's op finished, and when to dump), with Work's completion
// keys and the Backend's supports* queries, came in torch 2.15; 2.14 has its
// abort hooks alone, older torch neither. setup.py reads which from torch's
// Backend.hpp (no header's presence tells) and sets
// FAIRRING_HAS_BACKEND_HOOKS; without the full set fairring offers none.
#ifndef FAIRRING_HAS_BACKEND_HOOKS
#error "FAIRRING_HAS_BACKEND_HOOKS is set by setup.py"
#endif
#if FAIRRING_HAS_BACKEND_HOOKS
#include <torch/csrc/distributed/c10d/Hooks.hpp>
#endif

namespace fairring {

// What a backend tells the consumers of torch's backend hooks (its flight
// recorder): that a Work it handed out succeeded, under a key no other Work
// of the process ever has, and that a failure or timeout settled.
//
// Every Work the backend hands out goes through report(), which gives it its
// key. Success is pushed to the completion hooks once, from the thread that
// completes a CPU future, or from this object's poller thread for Works whose
// completion can only be asked (NCCL's, which completes on the GPU; Gloo's
// point-to-point Works, which have no future). The poller's thread asks in
// CUDA's relaxed capture mode, so that its event queries never invalidate a
// graph another thread captures. A failed Work never reports
// completion: it starts the abort hooks instead. They run on a thread of
// their own, so that the error reaches its waiter within its timeout however
// long a dump takes; awaitFailureReports() lets the process finish them
// before it exits.
class BackendHooks {
 public:
  // The key, and the op's duration from issue to completion as seen by the
  // host.
  using Completion =
      std::function<void(uint64_t key, std::optional<float> durationMs)>;
  using Abort = std::function<void()>;

  BackendHooks();
  // Stops the poller (joined, or left to end by itself where this runs on
  // it); Works not complete by then report nothing.
  ~BackendHooks();

  BackendHooks(const BackendHooks&) = delete;
  BackendHooks& operator=(const BackendHooks&) = delete;

  void addCompletionHook(int64_t id, Completion hook);
  void removeCompletionHook(int64_t id);
  void addAbortHook(int64_t id, Abort hook);
  void removeAbortHook(int64_t id);

  // Starts every abort hook (a failure settled), on a thread of their own,
  // unless quiet() was called.
  void runAbortHooks() const;
  // From now on, failures are this rank's own doing (it is shutting its group
  // down or aborting it): they run no abort hooks. A dump is for a failure;
  // and a hook run as the group goes may release the group's last reference
  // on a thread the backend's destructor joins.
  void quiet();

  // The Work to hand out for `work`. Where torch has no such hooks, `work`.
  // `captured`: launched during graph capture (device/capture.h), so its
  // completion may never be asked: handed out as it is, it reports nothing,
  // as ProcessGroupNCCL's watchdog leaves captured Works alone.
  c10::intrusive_ptr<c10d::Work> report(
      c10::intrusive_ptr<c10d::Work> work, bool captured = false);

  // Hooks live in a registry shared with the reporting callbacks, which may
  // run after the backend (and this object) are gone.
  struct Registry;
  struct Pending;

 private:
  // The Works whose completion must be asked, shared with the thread that
  // asks: a report it makes may release the backend's last reference, and so
  // destroy this object, on that very thread.
  struct Poller;

  const std::shared_ptr<Registry> registry_;
  const std::shared_ptr<Poller> poller_;
  std::thread polling_; // started by the first Work that must be polled
};

// Waits up to `limit` for the abort hooks' runs started in this process (the
// flight recorder's dumps of failures) to end; false if some still run. At
// exit (fairring/__init__.py), so that a process that exits on a failure's
// error still writes its dump.
bool awaitFailureReports(std::chrono::milliseconds limit);

} // namespace fairring
