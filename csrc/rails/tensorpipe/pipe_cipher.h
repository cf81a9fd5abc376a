#pragma once

// The encryption of one pipe's messages (FAIRRING_RAILS_ENCRYPT): AES-256-GCM
// under a key per direction, derived from the pipe's session key, which only
// its two proven ends hold (handshake.h). A message's nonce is its number in
// its direction: TensorPipe delivers a pipe's messages in order, so both ends
// count alike, and a message altered, dropped, replayed or reordered on the
// wire fails to open. A data message's tag is authenticated with its bytes;
// a note is encrypted whole.
//
// Not thread-safe: the connection seals in the order of its writes (under
// its write lock) and numbers receipts in the order descriptors arrive (on
// TensorPipe's loop thread).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fairring::rails {

class PipeCipher {
 public:
  // `dialler`: which end of the pipe this is.
  PipeCipher(std::string_view session, bool dialler);

  // Seals the next message sent into `sealed` (bytes + kSealBytes).
  void sealNext(
      std::string_view aad, const void* plain, size_t bytes, void* sealed);
  // The number of the next message received, in arrival order.
  uint64_t nextReceived() {
    return received_++;
  }
  // Opens received message `number` (`bytes`: its plain length): false if
  // it does not open.
  bool open(
      uint64_t number,
      std::string_view aad,
      const void* sealed,
      size_t bytes,
      void* plain) const;

  static constexpr size_t kSealBytes = 16; // GCM's tag

 private:
  const std::string sendKey_;
  const std::string receiveKey_;
  uint64_t sent_ = 0;
  uint64_t received_ = 0;
};

} // namespace fairring::rails
