#pragma once

// What the rails protocols need from a transport: one ordered, reliable
// message connection per (rail peer, lane) for the data (lanes.h), and one
// per neighbour for control (watch.h). TensorPipe (tensorpipe/mesh.h) and NIXL
// (nixl/mesh.h) implement these two classes; the protocols and the engine do
// not know which one runs (rails/mesh_factory.h chooses).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "rails/peer_text.h"

namespace fairring::rails {

// The lanes between two rail peers. Each is its own connection, so reduced
// shards coming back never queue behind shards of a slice the receiver has
// not started (see docs/design.md, "Rails mesh and lanes").
enum Lane : int { kShards = 0, kReduced = 1 };
constexpr int kLanes = 2;

// Messages received so far from a rail peer, by lane: what a rail switch
// resends from (rails/failover.h).
struct ReceivedCounts {
  uint64_t shards = 0;
  uint64_t reduced = 0;

  uint64_t& operator[](Lane lane) {
    return lane == kShards ? shards : reduced;
  }
  bool operator==(const ReceivedCounts&) const = default;
};

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
  // The tag and length of the message a read found.
  using Received = std::function<void(
      const std::string& error, std::string tag, size_t bytes)>;

  // Sends `tag` and the bytes of `buffer`; `done` once the buffer may be
  // reused.
  virtual void write(std::string tag, const Buffer& buffer, Done done) = 0;
  // Receives the next message. Its payload lands in `target` only if it is
  // tagged `tag` and exactly `target.bytes` long; any other message is
  // reported with its tag and length, and `target` is left untouched. The
  // target is the reader's until `received` runs: a one-sided transport grants
  // it to the sender for this one message (docs/design.md, "NIXL rails").
  virtual void read(
      std::string tag, const Buffer& target, Received received) = 0;

  // Control connections carry notes: short texts with no payload.
  using Note = std::function<void(const std::string& error, std::string text)>;
  virtual void writeNote(std::string text, Done done) = 0;
  // Reads the next note; a message that is not a note, or longer than
  // kMaxNoteBytes, is an error.
  virtual void readNote(Note note) = 0;
};

constexpr size_t kMaxNoteBytes = 4096;

// Connections from this rank to its rail peers (the ranks with the same local
// index on every other machine): data lanes, and one control connection
// each. The other ranks of this machine get a control connection too, so that
// news of a failure reaches every rank through rails and machines.
class Mesh {
 public:
  virtual ~Mesh() = default;

  virtual int machine() const = 0; // this rank's
  virtual int numMachines() const = 0;
  virtual int peerRank(int machine) const = 0;
  // To the rail peer on `machine` (not this rank's own).
  virtual Connection& connection(int machine, Lane lane) = 0;
  // The ranks with a control connection: rail peers by machine, then the
  // other ranks of this machine by local index.
  virtual const std::vector<int>& neighbours() const = 0;
  // The control connection to neighbours()[index].
  virtual Connection& control(size_t index) = 0;
  // The memory every buffer the data connections carry lies in, given once,
  // before the first transfer. Collective over the neighbours: a one-sided
  // transport registers it and learns where its peers' lies.
  virtual void registerStaging(const Buffer& /*staging*/) {}
  // Pinned host memory the transport stages device buffers through, once
  // used (for the engine's footprint).
  virtual int64_t pinnedHostBytes() const {
    return 0;
  }
  // Closes every data connection: pending and later transfers fail, here and
  // at the peers, which so learn of a failure without waiting for a timeout.
  // Control connections stay open, so that a failure notice sent just before
  // still arrives. Safe from any thread, the transport's included.
  virtual void close() = 0;
  // Closes everything, then waits until no callback runs or will run: after
  // it returns, the state those callbacks use may go. Idempotent.
  virtual void shutdown() = 0;
  // Where this rank listens and what it speaks, for logs.
  virtual std::string describe() const = 0;
  // The name of the network interface this rank listens on if it is down
  // (its link lost), else empty.
  virtual std::string downInterface() const = 0;

  // Rail switches (rails/failover.h); a transport that cannot switch keeps
  // these defaults. Whether messages are kept for a resend (Lanes): the same
  // on every rank of the group.
  virtual bool resends() const {
    return false;
  }
  // The interface this rank's rails listen on.
  virtual std::string interfaceName() const {
    return "";
  }
  // The machine's other interfaces a switch may move them to, best first;
  // empty if none (or the transport cannot switch).
  virtual std::vector<std::string> spareInterfaces() const {
    return {};
  }
  // Closes the data and control connections to the rail peer on `machine`:
  // their pending transfers fail. The closed ones stay in place, so a
  // caller that still reaches them gets an error, until reconnect().
  virtual void detach(int /*machine*/) {}
  // Connects to the rail peer on `machine` again, as the pair's switch
  // number `generation`: the rank on the higher machine listens on
  // `interface` (this machine's own or a spare) and publishes where in the
  // store; the other dials it. Each side gives what it has received on each
  // lane, and gets the peer's. Throws, saying why, at `deadline` or once
  // `cancelled()`.
  virtual ReceivedCounts reconnect(
      int /*machine*/,
      const std::string& /*interface*/,
      uint64_t /*generation*/,
      ReceivedCounts /*received*/,
      std::chrono::steady_clock::time_point /*deadline*/,
      const std::function<bool()>& /*cancelled*/) {
    throw std::logic_error("fairring: this rails transport cannot switch");
  }
};

} // namespace fairring::rails
