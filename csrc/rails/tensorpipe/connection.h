#pragma once

#include <memory>
#include <mutex>
#include <string>

#include <tensorpipe/common/device.h>

#include "rails/tensorpipe/pipe_cipher.h"
#include "rails/transport.h"

namespace tensorpipe {
class Pipe;
} // namespace tensorpipe

namespace fairring::rails {

// One pipe, as a Connection (rails/transport.h): tagged buffers and notes.
// Its callbacks run on TensorPipe's loop thread. Reads check a message's
// shape (count, length, devices, a note's size) against what is expected
// before TensorPipe is given memory for it: TensorPipe trusts the sender's
// descriptor. With a cipher (FAIRRING_RAILS_ENCRYPT), every message goes out
// sealed (pipe_cipher.h), through a copy, and is opened from a copy into the
// reader's memory only if it is intact; CPU buffers only.
class TensorpipeConnection final : public Connection {
 public:
  // `own`: where this rank's buffers are; `target`: where the peer's are.
  TensorpipeConnection(
      std::shared_ptr<tensorpipe::Pipe> pipe,
      tensorpipe::Device own,
      tensorpipe::Device target,
      std::unique_ptr<PipeCipher> cipher = nullptr);

  void write(std::string tag, const Buffer& buffer, Done done) override;
  void read(std::string tag, const Buffer& target, Received received) override;
  void writeNote(std::string text, Done done) override;
  void readNote(Note note) override;
  // Closes the pipe: its pending callbacks run with an error.
  void close();

 private:
  const std::shared_ptr<tensorpipe::Pipe> pipe_;
  const tensorpipe::Device own_;
  const tensorpipe::Device target_;
  const std::unique_ptr<PipeCipher> cipher_;
  // The tests' on-path attacker (FAIRRING_TEST_RAILS_TAMPER=1): one byte of
  // each data message flipped on the wire.
  const bool tamper_;
  // Held from sealing a message to handing it to the pipe, so that a cipher
  // numbers messages in the pipe's order; recursive, as a write's callback
  // may run inline (on an error) and write again.
  std::recursive_mutex writing_;
};

} // namespace fairring::rails
