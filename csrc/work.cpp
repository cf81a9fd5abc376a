#include "work.h"

#include <algorithm>

namespace fairring {

AllOfWork::AllOfWork(std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : works_(std::move(works)) {}

bool AllOfWork::isCompleted() {
  return std::all_of(works_.begin(), works_.end(), [](const auto& work) {
    return work->isCompleted();
  });
}

bool AllOfWork::isSuccess() const {
  return exception() == nullptr;
}

std::exception_ptr AllOfWork::exception() const {
  for (const auto& work : works_) {
    if (work->isCompleted() && !work->isSuccess()) {
      return work->exception();
    }
  }
  return nullptr;
}

bool AllOfWork::wait(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const bool bounded = timeout != kNoTimeout;
  const auto deadline = Clock::now() + timeout;
  for (const auto& work : works_) {
    auto remaining = timeout;
    if (bounded) {
      remaining = std::max(
          std::chrono::milliseconds(0),
          std::chrono::duration_cast<std::chrono::milliseconds>(
              deadline - Clock::now()));
    }
    work->wait(remaining);
  }
  return true;
}

void AllOfWork::abort() {
  for (const auto& work : works_) {
    work->abort();
  }
}

} // namespace fairring
