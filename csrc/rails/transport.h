#pragma once

// What the rails protocol (lanes.h) needs from a transport: one ordered,
// reliable message connection per (rail peer, lane). TensorPipe provides it
// today (tensorpipe_mesh.h); another transport replaces it by implementing
// these two classes, without touching the protocol or the engine.

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

namespace fairring::rails {

// The lanes between two rail peers. Each is its own connection, so reduced
// shards coming back never queue behind shards of a slice the receiver has
// not started (see docs/design.md, "Rails mesh and lanes").
enum Lane : int { kShards = 0, kReduced = 1 };
constexpr int kLanes = 2;

// Memory a message is sent from or received into. CUDA memory is ordered on
// `stream`: a send reads it after the work queued there so far, and received
// bytes are visible to work queued there after the receive completes.
struct Buffer {
  void* data = nullptr;
  size_t bytes = 0;
  c10::Device device{c10::kCPU};
  std::optional<c10::Stream> stream;
};

// One direction-agnostic, ordered connection to one rail peer on one lane.
// Every callback runs on the transport's own thread: it must not block.
class Connection {
 public:
  virtual ~Connection() = default;

  // An empty string means success; otherwise, why the operation failed.
  using Done = std::function<void(const std::string& error)>;
  using Header =
      std::function<void(const std::string& error, std::string tag, size_t bytes)>;

  // Sends `tag` and the bytes of `buffer`; `done` once the buffer may be reused.
  virtual void write(std::string tag, const Buffer& buffer, Done done) = 0;
  // Reads the tag and length of the next message.
  virtual void readHeader(Header header) = 0;
  // Reads the payload of the message whose header was just read.
  virtual void readPayload(const Buffer& buffer, Done done) = 0;
};

// Connections from this rank to its rail peers: the ranks with the same local
// index on every other machine.
class Mesh {
 public:
  virtual ~Mesh() = default;

  virtual int machine() const = 0; // this rank's
  virtual int numMachines() const = 0;
  virtual int peerRank(int machine) const = 0;
  // To the rail peer on `machine` (not this rank's own).
  virtual Connection& connection(int machine, Lane lane) = 0;
  // Closes every connection: pending and later operations fail, here and at
  // the peers, which so learn of a failure without waiting for a timeout.
  // Safe from any thread, the transport's included.
  virtual void close() = 0;
  // Closes, then waits until no callback runs or will run: after it returns,
  // the state those callbacks use may go. Idempotent.
  virtual void shutdown() = 0;
  // Where this rank listens and what it speaks, for logs.
  virtual std::string describe() const = 0;
};

} // namespace fairring::rails
