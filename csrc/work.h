#pragma once

#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace fairring {

// One Work standing for several: it completes when all of them have and
// fails with the first failure. Gloo's point-to-point Works have no Future,
// so this waits on the Works themselves rather than on their futures.
class AllOfWork final : public c10d::Work {
 public:
  explicit AllOfWork(std::vector<c10::intrusive_ptr<c10d::Work>> works);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // `timeout` bounds the whole wait, not each member's.
  bool wait(std::chrono::milliseconds timeout) override;
  void abort() override;

 private:
  const std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

} // namespace fairring
