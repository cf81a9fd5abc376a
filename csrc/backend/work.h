#pragma once

#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace fairring {

// A Work for an operation whose outcome is `future`. Unlike the Work that
// c10d::Work::create_from_future makes, wait() rethrows the operation's error
// (that one returns as if the operation had succeeded) and honours a timeout.
class FutureWork final : public c10d::Work {
 public:
  FutureWork(
      c10::intrusive_ptr<c10::ivalue::Future> future,
      c10d::OpType opType,
      const char* description);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // Throws the operation's error, or a timeout error naming the operation.
  // With CUDA tensors, the caller's current streams then wait for the
  // operation's; the host does not wait for the GPU.
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }

 private:
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
  const char* const description_;
};

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
