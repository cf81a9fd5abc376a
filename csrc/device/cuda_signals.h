#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>

#include <c10/core/Device.h>

#include "device/device.h"

namespace fairring {

// One engine's signals on CUDA (DeviceContext::raiseSignal; docs/design.md,
// "The host never waits"): 32-bit words in mapped pinned host memory that
// the host writes, and a one-thread kernel that an engine stream runs to
// wait until a word reaches a ticket (the comparison of ticketReleased,
// which wraps).
//
// Words are never freed: an engine's stream may still run a wait on one
// after the engine is gone (its streams are retired, not destroyed, when
// they do not drain). Each engine takes words no engine had (4 bytes each of
// a 4 KiB pinned page), so they start at 0.
//
// Threads: make() on the engine's owner; wait() on a stage thread (CUDA's
// stream calls are thread-safe); raise() and open() on any.
class CudaSignals {
 public:
  // Null where the engine cannot launch ahead, which a notice says once:
  // the driver lacks a function the wait needs, or its kernel did not load.
  static std::unique_ptr<CudaSignals> make(c10::Device device);

  // `stream` (a cudaStream_t) waits until `signal` reached `ticket`. Throws
  // on a CUDA error.
  void wait(void* stream, Signal signal, uint32_t ticket) const;
  // The host raises `signal` to `ticket`; nothing once opened.
  void raise(Signal signal, uint32_t ticket);
  // Every wait passes from now on: each word goes 2^30 tickets past the
  // greatest raised, which covers every ticket an engine can have issued.
  void open();

  // `kernel`: the wait kernel (a CUfunction) loaded on `device`; `words`:
  // the host's and the device's addresses of each signal's word.
  struct Word {
    uint32_t* host;
    uint64_t device; // CUdeviceptr
  };
  CudaSignals(
      c10::Device device, void* kernel, std::array<Word, kSignals> words)
      : device_(device), kernel_(kernel), words_(words) {}

 private:
  void store(Signal signal, uint32_t value);

  const c10::Device device_;
  void* const kernel_;
  const std::array<Word, kSignals> words_;
  std::mutex mutex_;
  std::array<uint32_t, kSignals> raised_{}; // the greatest raised, by signal
  bool opened_ = false;
};

} // namespace fairring
