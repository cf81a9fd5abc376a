#pragma once

// A stand-in for a local step's group, for tests of how GroupSteps stops its
// groups: it runs no collective, records what it is asked, and its abort()
// or shutdown() can block, as ncclCommAbort can while another communicator's
// kernel spins. Test-only (bound in testing/bindings.cpp).

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace fairring::testing {

// What every group of one test saw, in order, shared by the groups.
struct GroupLog {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::string> events; // "<group> abort", "<group> shutdown", ...
  std::chrono::milliseconds blockFor{0}; // how long a stop call blocks at most
  bool released = false; // every blocked stop call returns

  void record(std::string event) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      events.push_back(std::move(event));
    }
    changed.notify_all();
  }
  std::vector<std::string> snapshot() {
    std::lock_guard<std::mutex> lock(mutex);
    return events;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      released = true;
    }
    changed.notify_all();
  }
};

class RecordingGroup final : public c10d::Backend {
 public:
  RecordingGroup(
      std::string label, std::string backendName, std::shared_ptr<GroupLog> log)
      : c10d::Backend(0, 2),
        label_(std::move(label)),
        backendName_(std::move(backendName)),
        log_(std::move(log)) {}

  const std::string getBackendName() const override {
    return backendName_;
  }
  void setTimeout(std::chrono::milliseconds timeout) override {
    log_->record(label_ + " timeout " + std::to_string(timeout.count()));
  }
  void abort() override {
    stop("abort");
  }
  void shutdown() override {
    stop("shutdown");
  }

 private:
  // Records the call's start, blocks up to blockFor (or until released),
  // records its end.
  void stop(const std::string& what) {
    log_->record(label_ + " " + what);
    {
      std::unique_lock<std::mutex> lock(log_->mutex);
      log_->changed.wait_for(
          lock, log_->blockFor, [this] { return log_->released; });
    }
    log_->record(label_ + " " + what + " returned");
  }

  const std::string label_;
  const std::string backendName_;
  const std::shared_ptr<GroupLog> log_;
};

} // namespace fairring::testing
