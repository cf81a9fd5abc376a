#pragma once

#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace fairring {

// CUDA graph capture, as fairring meets it (docs/design.md, "Graph
// capture"). While a stream is captured, work issued on it is recorded into
// a graph, not run: an event recorded there may not be queried by any thread,
// nor waited for by a stream outside the capture, and in CUDA's default
// (global) mode the capturing thread may not query events at all. So what
// the caller issues during capture goes to NCCL, which captures its own
// kernels, and fairring neither tracks nor polls it.

// Whether work the calling thread issues now on `device` is captured: on
// CUDA, whether its current stream on that device is capturing; on the
// emulated device, whether the tests' model of a capture runs on this thread
// (CaptureModel).
bool graphCaptureUnderway(c10::Device device);

// For a thread of fairring's that queries events while another thread may
// capture in CUDA's global mode (the hooks' poller): its calls no longer
// invalidate that capture (cudaStreamCaptureModeRelaxed, for the thread's
// life). Querying a captured event stays illegal: such events are never
// handed to it. Nothing where no GPU is visible.
void relaxCaptureChecksOnThisThread();

// The tests' model of capture, on the emulated device (whose "CUDA" tensors
// are CPU tensors). A test begins a capture on its thread; from then until it
// ends, graphCaptureUnderway() is true on that thread for any device, unless
// the test asked fairring not to see it (the negative control). Whatever
// fairring sees, what is issued during the model's capture behaves as on
// CUDA: the caller's fences are captured ones (device/emulated.cpp), and so
// are the Works its collectives return (backend/work.h, ModelCapturedWork);
// a query of either, or a wait for a captured fence from another stream, is
// recorded as a violation: on CUDA it would invalidate the capture. Process-
// wide; never used outside tests.
class CaptureModel {
 public:
  // `seen`: whether fairring's checks see this capture.
  static void begin(bool seen);
  // Ends the capture; its captured fences and Works stay captured.
  static void end();
  // Whether the model's capture runs on this thread (what CUDA would know).
  static bool onThisThread();
  // Whether fairring's checks see it (graphCaptureUnderway()).
  static bool seenOnThisThread();
  // Something CUDA forbids during or after capture was done: `what`.
  static void violated(const std::string& what);
  // The violations recorded since the last call, which clears them.
  static std::vector<std::string> takeViolations();
};

} // namespace fairring
