#include "local/copy_steps.h"

namespace fairring {

void CopySteps::reduceScatter(
    at::Tensor& slot,
    at::Tensor& /*parts*/,
    const at::Tensor& input,
    c10d::ReduceOp::RedOpType /*op*/,
    const LocalStepKey& /*key*/,
    Clock::time_point /*deadline*/) {
  slot.copy_(input);
}

void CopySteps::allGather(
    at::Tensor& output,
    const at::Tensor& part,
    const LocalStepKey& /*key*/,
    Clock::time_point /*deadline*/) {
  output.copy_(part);
}

} // namespace fairring
