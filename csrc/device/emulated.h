#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "device/device.h"

namespace fairring {

// A device with streams, emulated on the CPU for the tests, so that the CUDA
// engine's ordering (StreamedContext, the same code CUDA runs) is exercised
// on every CI run, with any number of ranks per machine, where no GPU is.
//
// Each stream is a worker thread that runs its queue in order; an event is a
// position in a stream; a device-side wait is an item that blocks the worker
// until another stream has passed a position. The local steps are real,
// blocking Gloo (or shared-memory) collectives run by the worker of the
// stream they are ordered on, as a NCCL kernel blocks its stream. The rails
// receive into bounce buffers, copied into place on the receive stream as
// TensorPipe's cuda_basic does; a send's copy runs on the send stream. Every
// item sleeps a seeded random jitter first.
//
// Chosen by tests with FAIRRING_TEST_EMULATED_DEVICE (CPU tensors then run
// on it); users never see it. Its value is a comma-separated list of:
//   seed=N              jitter seed (the rank is added), default 0
//   jitter_us=N         at most this long before each item, default 200
//   in_order            every stream of the process feeds one queue, in launch
//                       order, as CUDA_DEVICE_MAX_CONNECTIONS=1 or MPS make a
//                       GPU run them
//   unordered_launch    the engine launches its local steps as its stage
//                       threads get to them, not in its launch order
//                       (negative control: in_order must then deadlock)
//   force=rs_first|ag_first
//                       an all-gather (rs_first) or reduce-scatter (ag_first)
//                       enqueue waits, up to 500 ms, for the other stage's next
//                       enqueue: opposite orders on two ranks of a machine
//                       make the interleaving that deadlocks in_order with
//                       unordered_launch
//   ignore_arrivals     device waits for the receive stream's fences, and
//                       for the rails' signals, are dropped (negative
//                       control: wrong data must be caught)
//   receive_delay_ms=N  each copy of received bytes sleeps this long too
//   eager_engine        the group's engine is made at its first collective of
//                       any kind and warmed up, as a CUDA engine is
//                       (Backend::prepareEngine)
//   caller_stream       the caller has a stream, as CUDA's current stream:
//                       one for the process, on which the tests queue work
//                       (enqueueOnEmulatedCallerStream); the engine launches
//                       ahead (DeviceContext::launchesAhead), and an engine
//                       op's wait() makes that stream wait for the op's end,
//                       the host not waiting (FAIRRING_CUDA_WAIT=stream)
//   host_waits          with caller_stream: the engine does not launch ahead
//                       and wait() holds the host until the op is done
//                       (negative control: the old way)
//   caller_unordered    with caller_stream: the caller's stream does not wait
//                       for the op (negative control: a result read there
//                       must be caught wrong)
//   signals_stay_shut   a failure does not open the signals (negative
//                       control: the engine's streams, and the caller's
//                       stream behind them, then wait for an op that failed)
//   nccl_delegate       the delegate keeps ProcessGroupNCCL's contract since
//                       torch 2.8: a synchronous operation ends before it
//                       returns, and returns no Work; it coalesces, one
//                       block for the group, and refuses a call from a
//                       second thread while one is inside or a block is
//                       open (device/nccl_delegate_model.h)
//
// It also carries the tests' model of CUDA graph capture (device/capture.h):
// the caller's fences recorded during a capture are captured ones.
struct EmulatedDeviceSettings {
  uint64_t seed = 0;
  std::chrono::microseconds jitter{200};
  bool inOrder = false;
  bool unorderedLaunch = false;
  enum class Force { kNone, kReduceScatterFirst, kAllGatherFirst };
  Force force = Force::kNone;
  bool ignoreArrivals = false;
  std::chrono::milliseconds receiveDelay{0};
  bool eagerEngine = false;
  bool ncclDelegate = false;
  bool callerStream = false;
  bool hostWaits = false;
  bool callerUnordered = false;
  bool signalsStayShut = false;
};

// The settings in FAIRRING_TEST_EMULATED_DEVICE, or nothing when it is unset.
// Throws on a value it does not understand.
std::optional<EmulatedDeviceSettings> emulatedDeviceFromEnv();

// The caller_stream setting's stream: `work` runs there after what was
// queued before (an engine op's hold among it); synchronize returns once
// all of it has run, as torch.cuda.synchronize() would, or false once
// `timeout` has passed first.
void enqueueOnEmulatedCallerStream(std::function<void()> work);
bool synchronizeEmulatedCallerStream(std::chrono::milliseconds timeout);

std::unique_ptr<DeviceContext> makeEmulatedContext(
    const EmulatedDeviceSettings& settings, int rank);

} // namespace fairring
