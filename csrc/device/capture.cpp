#include "device/capture.h"

#include <atomic>
#include <mutex>
#include <thread>

#include "device/device.h"

namespace fairring {

namespace {

// The model's state: the capturing thread (if any) and what it recorded.
struct ModelState {
  std::mutex mutex;
  std::thread::id capturing;
  bool active = false;
  bool seen = false;
  std::vector<std::string> violations;
};

ModelState& model() {
  static ModelState state;
  return state;
}

// Read on every operation: kept apart so that the common case takes no lock.
std::atomic<bool> modelActive{false};

} // namespace

bool graphCaptureUnderway(c10::Device device) {
  return CaptureModel::seenOnThisThread() ||
      (device.is_cuda() && cudaGraphCaptureUnderway(device));
}

void CaptureModel::begin(bool seen) {
  ModelState& state = model();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.capturing = std::this_thread::get_id();
  state.active = true;
  state.seen = seen;
  modelActive = true;
}

void CaptureModel::end() {
  ModelState& state = model();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.active = false;
  modelActive = false;
}

bool CaptureModel::onThisThread() {
  if (!modelActive) {
    return false;
  }
  ModelState& state = model();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.active && state.capturing == std::this_thread::get_id();
}

bool CaptureModel::seenOnThisThread() {
  if (!modelActive) {
    return false;
  }
  ModelState& state = model();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.active && state.seen &&
      state.capturing == std::this_thread::get_id();
}

void CaptureModel::violated(const std::string& what) {
  ModelState& state = model();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.violations.push_back(what);
}

std::vector<std::string> CaptureModel::takeViolations() {
  ModelState& state = model();
  std::lock_guard<std::mutex> lock(state.mutex);
  std::vector<std::string> taken;
  taken.swap(state.violations);
  return taken;
}

} // namespace fairring
