#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tensorpipe {
class Context;
} // namespace tensorpipe

namespace fairring::rails {

// Test-only: a bare TensorPipe client (uv transport, basic channel) that
// throws scripted messages at a rank's rails listener and reports how it
// answered, so tests check over the wire what the mesh accepts
// (tests/test_wire_fuzz.py). It speaks TensorPipe, and of fairring's protocol
// only what it is told to send.
class WireProbe {
 public:
  struct Message {
    std::string metadata;
    std::vector<size_t> payloads; // lengths; the bytes are zeros
    std::vector<size_t> tensors; // lengths of CPU tensors of zeros
    // Tensors that name their target device are pushed at once; the others
    // wait for the reader to allocate.
    bool targetCpu = true;
  };

  struct Outcome {
    size_t written = 0; // messages whose write completed without error
    std::string writeError; // the first failed write's error
    std::optional<std::string> reply; // metadata of a message that came back
    std::string readError; // why none came back (e.g. the remote closed)
    std::string timedOut; // the step that ran out of time: "write", "read"
    double seconds = 0; // the whole exchange
  };

  // Owns its TensorPipe context (and so its loop thread).
  WireProbe();
  // Closes the context, failing whatever is pending, and joins its thread.
  ~WireProbe();
  WireProbe(const WireProbe&) = delete;
  WireProbe& operator=(const WireProbe&) = delete;

  // Opens a pipe to `url`, writes `messages` in order and waits for the
  // writes; then, if `readReply`, waits for one message or error coming back.
  // Each step waits at most `timeout`. The pipe is closed on return. Blocks
  // the calling thread; never call it on a TensorPipe thread.
  Outcome exchange(
      const std::string& url,
      const std::vector<Message>& messages,
      bool readReply,
      std::chrono::milliseconds timeout);

  // A forger's handshake (rails/tensorpipe/handshake.h): opens a pipe to
  // `url`, writes `hello`, reads the listener's first text (the challenge),
  // writes what `answer` makes of it, and reads one more (the welcome). The
  // outcome's reply is that last text, if any; `challenge` is the first.
  struct Handshake {
    std::optional<std::string> challenge;
    Outcome outcome;
  };
  Handshake handshake(
      const std::string& url,
      const std::string& hello,
      const std::function<std::string(const std::string&)>& answer,
      std::chrono::milliseconds timeout);

 private:
  std::shared_ptr<tensorpipe::Context> context_;
};

} // namespace fairring::rails
