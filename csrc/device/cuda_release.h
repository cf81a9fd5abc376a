#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include <c10/core/Device.h>

#include "device/device.h"

namespace fairring {

// One engine's release word on CUDA (docs/design.md, "The host never
// waits"): a 32-bit word in mapped pinned host memory, which the engine's
// output stream writes with cuStreamWriteValue32 after an op's last local
// step, and the host writes on a failure; a caller's stream waits for it
// with a one-thread kernel that polls it until it reaches the op's ticket
// (the comparison of ticketReleased, which wraps).
//
// Words are never freed: a caller's stream may wait on one, and an engine's
// stream may still write it, long after the engine is gone. Each engine takes
// a word no engine had (4 bytes of a 4 KiB pinned page), so it starts at 0.
//
// Threads: make() on the engine's owner; hold() on the caller's; release() on
// the output stage's thread or a failing one (CUDA's stream calls are
// thread-safe); releaseFromHost() on any.
class CudaReleaseWord {
 public:
  // Null where the host must wait instead, which a notice says once: the
  // driver lacks a function the release needs, or the hold kernel did not
  // load.
  static std::shared_ptr<CudaReleaseWord> make(c10::Device device);

  // The caller's current stream on the device waits until `ticket` is
  // released; false, doing nothing, where it is released already or that
  // stream is being captured.
  bool hold(uint32_t ticket) const;
  // `stream` (a cudaStream_t) writes `ticket` after its work so far. Throws
  // on a CUDA error.
  void release(void* stream, uint32_t ticket) const;
  // The host writes the greatest ticket it released so far, or `ticket`.
  void releaseFromHost(uint32_t ticket);
  // Writes the host's last release again (the engine's streams are drained
  // or retired): nothing a stream wrote after it stands.
  void rewriteHostRelease();

  // `kernel`: the hold kernel (a CUfunction) loaded on `device`.
  CudaReleaseWord(
      c10::Device device, void* kernel, uint32_t* host, uint64_t address)
      : device_(device), kernel_(kernel), host_(host), address_(address) {}

 private:
  const c10::Device device_;
  void* const kernel_;
  uint32_t* const host_; // the word, as the host writes it
  const uint64_t address_; // the word, as the device sees it (CUdeviceptr)
  std::mutex hostMutex_;
  std::optional<uint32_t> hostTicket_; // the greatest released from the host
};

} // namespace fairring
