#pragma once

#include "local/local_steps.h"

namespace fairring {

// The local steps of a machine with one rank: its slot is its whole input.
// Header-only: two copies do not need a translation unit of their own, which
// each of CI's four builds would compile against torch's headers.
class CopySteps final : public LocalSteps {
 public:
  void reduceScatter(
      at::Tensor& slot,
      at::Tensor& /*parts*/,
      const at::Tensor& input,
      c10d::ReduceOp::RedOpType /*op*/,
      const LocalStepKey& /*key*/,
      Clock::time_point /*deadline*/) override {
    slot.copy_(input);
  }
  void allGather(
      at::Tensor& output,
      const at::Tensor& part,
      const LocalStepKey& /*key*/,
      Clock::time_point /*deadline*/) override {
    output.copy_(part);
  }
  std::string name() const override {
    return "none";
  }
  void abort() override {}
};

} // namespace fairring
