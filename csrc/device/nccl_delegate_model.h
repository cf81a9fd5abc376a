#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace fairring {

// The tests' model of ProcessGroupNCCL's contract since torch 2.8, over the
// emulated device's delegate (Gloo, whose "CUDA" tensors are CPU tensors): a
// synchronous operation (its options' asyncOp false) has ended when the call
// returns, as NCCL's kernel is then queued on the caller's current stream,
// and returns no Work. Point-to-point operations, which have no asyncOp, and
// everything else are Gloo's. It coalesces as NCCL does, one block for the
// group whichever thread issues, and refuses a second thread inside it at
// once or into an open block. So CI catches code that needs a delegate's
// Work where NCCL gives none, or that enters NCCL from two threads
// (docs/design.md, "ProcessGroupNCCL's contract").
//
// `gloo` itself unless FAIRRING_TEST_EMULATED_DEVICE asks for the model
// (nccl_delegate, device/emulated.h).
c10::intrusive_ptr<c10d::Backend> asEmulatedDeviceDelegate(
    c10::intrusive_ptr<c10d::Backend> gloo);

} // namespace fairring
