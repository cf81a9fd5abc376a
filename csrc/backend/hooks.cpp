#include <torch_headers.h> // first: the precompiled torch headers

#include "backend/hooks.h"

#include <atomic>
#include <condition_variable>

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include "backend/work.h"
#include "device/capture.h"
#include "log.h"
#include "thread_name.h"

namespace fairring {

namespace {

using Clock = std::chrono::steady_clock;

// How often the poller asks the Works that cannot push their completion.
constexpr auto kPollInterval = std::chrono::milliseconds(2);

// Process-wide, so that no two Works of any of the process's groups share a
// key (the flight recorder of one backend name serves them all).
std::atomic<uint64_t> nextCompletionKey{1};

// The abort hooks' runs (the flight recorder's dumps) still going, in the
// whole process: each runs on a thread of its own, which the process owns
// and awaitFailureReports() waits for at exit.
struct ReportsInFlight {
  std::mutex mutex;
  std::condition_variable done;
  int running = 0;
};

std::shared_ptr<ReportsInFlight> reportsInFlight() {
  static const auto inFlight = std::make_shared<ReportsInFlight>();
  return inFlight;
}

// Runs `hooks` off the calling thread: that thread is failing ops whose
// waiters must hear of it now, within their timeout, not after a dump (which
// symbolizes stack traces and writes files, for seconds). Not while `running`
// (one group's earlier run, which a failure's many failed Works would each
// start again): that run's dump already shows the failure.
void reportFailure(
    std::vector<BackendHooks::Abort> hooks,
    const std::shared_ptr<std::atomic<bool>>& running) {
  if (hooks.empty() || running->exchange(true)) {
    return;
  }
  auto inFlight = reportsInFlight();
  {
    std::lock_guard<std::mutex> lock(inFlight->mutex);
    ++inFlight->running;
  }
  std::thread([inFlight, running, hooks = std::move(hooks)] {
    nameThisThread("fr-abort-hooks");
    for (const auto& hook : hooks) {
      try {
        hook();
      } catch (const std::exception& error) {
        notice(
            LogLevel::kWarning,
            c10::str("fairring: an abort hook failed: ", error.what()));
      }
    }
    *running = false;
    {
      std::lock_guard<std::mutex> lock(inFlight->mutex);
      --inFlight->running;
    }
    inFlight->done.notify_all();
  }).detach();
}

} // namespace

// Hooks of one kind, by id. Called from a copy taken under the lock: a hook
// may take its own locks, and one that unregisters waits for none of ours.
// Outside the anonymous namespace: BackendHooks::Registry holds two, and
// setup.py may compile this file inside a unit of several, where GCC counts
// it as a header.
template <typename Hook>
class HookTable {
 public:
  void add(int64_t id, Hook hook) {
    std::lock_guard<std::mutex> lock(mutex_);
    hooks_.insert_or_assign(id, std::move(hook));
  }
  void remove(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    hooks_.erase(id);
  }
  template <typename... Args>
  void call(const Args&... args) const {
    for (const auto& hook : snapshot()) {
      hook(args...);
    }
  }
  std::vector<Hook> snapshot() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Hook> hooks;
    for (const auto& [id, hook] : hooks_) {
      hooks.push_back(hook);
    }
    return hooks;
  }

 private:
  mutable std::mutex mutex_;
  std::map<int64_t, Hook> hooks_;
};

bool awaitFailureReports(std::chrono::milliseconds limit) {
  auto inFlight = reportsInFlight();
  std::unique_lock<std::mutex> lock(inFlight->mutex);
  return inFlight->done.wait_for(
      lock, limit, [&] { return inFlight->running == 0; });
}

struct BackendHooks::Registry {
  HookTable<Completion> completion;
  HookTable<Abort> abort;
  std::atomic<bool> quiet{false};
  // Set while this group's abort hooks run; shared with the thread that
  // runs them, which may outlive the registry.
  const std::shared_ptr<std::atomic<bool>> reporting =
      std::make_shared<std::atomic<bool>>(false);

  void completed(uint64_t key, float durationMs) const {
    completion.call(key, std::optional<float>(durationMs));
  }
  void aborting() const {
    if (!quiet) {
      reportFailure(abort.snapshot(), reporting);
    }
  }
};

// One handed-out Work's report: made once, by whichever observer sees the
// outcome first (its future's callback, the poller, or a wait that threw).
struct BackendHooks::Pending {
  const uint64_t key = nextCompletionKey.fetch_add(1);
  const Clock::time_point issued = Clock::now();
  std::shared_ptr<const Registry> registry;
  std::atomic<bool> settled{false};
  std::atomic<float> durationMs{-1};

  void settle(bool success) {
    if (settled.exchange(true)) {
      return;
    }
    if (!success) {
      registry->aborting();
      return;
    }
    const float duration =
        std::chrono::duration<float, std::milli>(Clock::now() - issued).count();
    durationMs = duration;
    registry->completed(key, duration);
  }
};

#if FAIRRING_HAS_BACKEND_HOOKS

namespace {

// A Work that is `inner` in every respect but its completion key, and that
// settles its report when a wait on it fails.
class ReportedWork final : public ForwardingWork {
 public:
  ReportedWork(
      c10::intrusive_ptr<c10d::Work> inner,
      std::shared_ptr<BackendHooks::Pending> pending)
      : ForwardingWork(std::move(inner)), pending_(std::move(pending)) {}

  uint64_t getCompletionKey() const override {
    return pending_->key;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    try {
      return inner_->wait(timeout);
    } catch (...) {
      pending_->settle(false); // starts the dump
      throw;
    }
  }
  float getDuration() const override {
    const float duration = pending_->durationMs;
    TORCH_CHECK(
        duration >= 0,
        "fairring: this operation has not completed successfully");
    return duration;
  }

  // What torch with these hooks has besides ForwardingWork's.
  void blockCurrentStream() override {
    inner_->blockCurrentStream();
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return inner_->getFuture();
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override {
    return inner_->getFutureResult();
  }
  std::chrono::milliseconds getTimeout() const override {
    return inner_->getTimeout();
  }

 private:
  const std::shared_ptr<BackendHooks::Pending> pending_;
};

// The Work's future where its completion is a host event; null where it
// completes on a device (its future completes at launch) or has none.
c10::intrusive_ptr<c10::ivalue::Future> hostFuture(c10d::Work& work) {
  try {
    auto future = work.getFuture();
    return future && future->devices().empty() ? future : nullptr;
  } catch (const c10::Error&) {
    return nullptr; // Gloo's point-to-point Works, AllOfWork
  }
}

} // namespace

#endif

struct BackendHooks::Poller {
  std::mutex mutex;
  std::condition_variable wake;
  // Index by index: a Work and its report.
  std::vector<std::shared_ptr<Pending>> pending;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  bool stopping = false;

  void loop();
};

void BackendHooks::Poller::loop() {
  std::unique_lock<std::mutex> lock(mutex);
  while (true) {
    wake.wait(lock, [&] { return stopping || !pending.empty(); });
    if (stopping) {
      return;
    }
    // Asked without the lock: isCompleted() may take the Work's own locks.
    auto asked = std::move(pending);
    auto askedWorks = std::move(works);
    pending.clear();
    works.clear();
    lock.unlock();
    std::vector<std::shared_ptr<Pending>> stillPending;
    std::vector<c10::intrusive_ptr<c10d::Work>> stillWorks;
    for (size_t i = 0; i < asked.size(); ++i) {
      if (asked[i]->settled) {
        continue;
      }
      if (askedWorks[i]->isCompleted()) {
        asked[i]->settle(askedWorks[i]->isSuccess());
        continue;
      }
      stillPending.push_back(std::move(asked[i]));
      stillWorks.push_back(std::move(askedWorks[i]));
    }
    askedWorks.clear(); // a Work's last reference goes here, not under the lock
    lock.lock();
    for (size_t i = 0; i < stillPending.size(); ++i) {
      pending.push_back(std::move(stillPending[i]));
      works.push_back(std::move(stillWorks[i]));
    }
    if (!stillPending.empty()) {
      // A full interval before asking them again.
      wake.wait_for(lock, kPollInterval, [&] { return stopping; });
    }
  }
}

BackendHooks::BackendHooks()
    : registry_(std::make_shared<Registry>()),
      poller_(std::make_shared<Poller>()) {}

BackendHooks::~BackendHooks() {
  {
    std::lock_guard<std::mutex> lock(poller_->mutex);
    poller_->stopping = true;
  }
  poller_->wake.notify_all();
  if (!polling_.joinable()) {
    return;
  }
  if (polling_.get_id() == std::this_thread::get_id()) {
    polling_.detach(); // it touches only the Poller it co-owns, and returns
  } else {
    polling_.join();
  }
}

void BackendHooks::addCompletionHook(int64_t id, Completion hook) {
  registry_->completion.add(id, std::move(hook));
}

void BackendHooks::removeCompletionHook(int64_t id) {
  registry_->completion.remove(id);
}

void BackendHooks::addAbortHook(int64_t id, Abort hook) {
  registry_->abort.add(id, std::move(hook));
}

void BackendHooks::removeAbortHook(int64_t id) {
  registry_->abort.remove(id);
}

void BackendHooks::runAbortHooks() const {
  registry_->aborting();
}

void BackendHooks::quiet() {
  registry_->quiet = true;
}

c10::intrusive_ptr<c10d::Work> BackendHooks::report(
    c10::intrusive_ptr<c10d::Work> work, bool captured) {
#if FAIRRING_HAS_BACKEND_HOOKS
  if (!work || captured) {
    // An operation inside NCCL's coalescing block may have none.
    return work;
  }
  auto pending = std::make_shared<Pending>();
  pending->registry = registry_;
  if (auto future = hostFuture(*work)) {
    // Runs here if already complete, else on the completing thread, before
    // the callbacks of any waiter that comes later.
    future->addCallback([pending](c10::ivalue::Future& done) {
      pending->settle(!done.hasError());
    });
  } else {
    std::lock_guard<std::mutex> lock(poller_->mutex);
    poller_->pending.push_back(pending);
    poller_->works.push_back(work);
    if (!polling_.joinable()) {
      polling_ = std::thread([poller = poller_] {
        nameThisThread("fr-hooks-poll");
        relaxCaptureChecksOnThisThread();
        poller->loop();
      });
    }
    poller_->wake.notify_one();
  }
  return c10::make_intrusive<ReportedWork>(std::move(work), std::move(pending));
#else
  return work;
#endif
}

} // namespace fairring
