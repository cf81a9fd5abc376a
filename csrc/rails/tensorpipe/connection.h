#pragma once

#include <memory>
#include <string>

#include <tensorpipe/common/device.h>

#include "rails/transport.h"

namespace tensorpipe {
class Pipe;
} // namespace tensorpipe

namespace fairring::rails {

// One pipe, as a Connection (rails/transport.h): tagged buffers and notes.
// Its callbacks run on TensorPipe's loop thread. Reads check a message's
// shape (count, length, devices, a note's size) against what is expected
// before TensorPipe is given memory for it: TensorPipe trusts the sender's
// descriptor.
class TensorpipeConnection final : public Connection {
 public:
  // `own`: where this rank's buffers are; `target`: where the peer's are.
  TensorpipeConnection(
      std::shared_ptr<tensorpipe::Pipe> pipe,
      tensorpipe::Device own,
      tensorpipe::Device target);

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
};

} // namespace fairring::rails
