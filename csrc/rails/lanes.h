#pragma once

#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "rails/transport.h"

namespace fairring::rails {

// The rails message protocol, over any Mesh.
//
// A receiver says, in order, which messages it expects from each rail peer on
// each lane (`expect`): a tag and the memory the payload goes into. Lanes
// reads each (peer, lane) connection strictly in that order and posts a read
// only for the first expected message, so it never reads ahead into memory
// the receiver does not have yet. A message whose tag or length differs from
// the expected one fails the protocol: the ranks disagree about what they are
// exchanging, and mixing the data would be worse than stopping.
//
// Any failure (transport error, unexpected message) is reported once, through
// `onFailure`, with the peer rank involved and what was being moved; the
// mesh's data connections are then closed so the peers fail at once too.
// Later calls do nothing.
//
// The mesh is its owner's, who shuts it down (no callback runs after that)
// before destroying Lanes.
//
// Threads: `expect` and `send` may be called from any thread. Callbacks
// (`onArrival`, `onSent`, `onFailure`) run on the transport's thread, or
// inline on the caller's; they must not block and must not call back into
// Lanes under a lock they hold.
class Lanes {
 public:
  // `peerRank`: the rail peer whose transfer failed, -1 if closed here;
  // `mismatch`: the peer sent a different message than expected (the ranks
  // disagree), rather than the transfer failing.
  using Failure = std::function<void(
      int peerRank, bool mismatch, const std::string& message)>;

  struct Expected {
    std::string tag;
    Buffer target;
    std::string what; // for errors: "shards of op #3 slice 0"
    std::function<void()> onArrival;
  };

  Lanes(Mesh& mesh, Failure onFailure);

  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;

  // Queues a message to come from the rail peer on `machine` on `lane`, after
  // every message queued for that peer and lane before it.
  void expect(int machine, Lane lane, Expected expected);
  // Sends `buffer` tagged `tag`; `onSent` once the buffer may be reused.
  void send(
      int machine,
      Lane lane,
      std::string tag,
      const Buffer& buffer,
      std::string what,
      std::function<void()> onSent);
  // Fails every pending transfer (reported as `reason`) and closes the mesh.
  void close(const std::string& reason);

  const Mesh& mesh() const {
    return mesh_;
  }
  int64_t bytesSent() const {
    return bytesSent_.load();
  }
  int64_t bytesReceived() const {
    return bytesReceived_.load();
  }

 private:
  // Posts the read for the first message expected from `machine` on `lane`;
  // its completion posts the next.
  void readNext(int machine, Lane lane);
  void fail(int peerRank, const std::string& message, bool mismatch = false);
  bool stopped();
  void checkPeer(int machine) const;
  std::string fromPeer(const Expected& expected, int machine, Lane lane) const;

  Mesh& mesh_;
  const Failure onFailure_;
  std::atomic<int64_t> bytesSent_{0};
  std::atomic<int64_t> bytesReceived_{0};

  std::mutex mutex_;
  bool failed_ = false; // guarded by mutex_
  // By machine and lane: what is expected, in order, and whether a read for
  // the first is posted. Guarded by mutex_.
  std::vector<std::array<std::deque<Expected>, kLanes>> expected_;
  std::vector<std::array<bool, kLanes>> reading_;
};

} // namespace fairring::rails
