#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
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
// Resends (when the mesh can switch a rail peer to another interface,
// rails/failover.h). Every message sent to a rail peer is numbered per lane,
// and kept until the peer acknowledges it: the peer's Lanes counts what it
// received and says so in "acked" notes on the control connection, at most
// one in flight per peer. `onSent` runs once the transport is done with the
// buffer for now (it may still go again); `onReleased` once the peer has it,
// so the buffer may be reused. A transport error on a peer's connections is
// then not a failure yet: Lanes stops using them and tells `onBroken`, whose
// owner either switches the peer (suspend, quiesce, resume: the messages the
// peer lacks go again, in order, on the new connections, and nothing arrives
// twice) or fails it (failPeer). Without resends, `onReleased` runs with
// `onSent` and every transport error fails.
//
// The mesh is its owner's, who shuts it down (no callback runs after that)
// before destroying Lanes.
//
// Threads: every method may be called from any thread but quiesce(), which
// blocks and must not run on the transport's. Callbacks (`onArrival`,
// `onSent`, `onReleased`, `onFailure`, `onBroken`) run on the transport's
// thread, or inline on the caller's; they must not block and must not call
// back into Lanes under a lock they hold.
// The control note by which a rank acknowledges what arrived from a rail
// peer: "acked <shards> <reduced>", the counts in decimal.
std::string ackedNote(ReceivedCounts counts);
// The counts of an acked note, or nothing if `text` is not one.
std::optional<ReceivedCounts> parseAckedNote(std::string_view text);

class Lanes {
 public:
  using Clock = std::chrono::steady_clock;
  // `peerRank`: the rail peer whose transfer failed, -1 if closed here;
  // `mismatch`: the peer sent a different message than expected (the ranks
  // disagree), rather than the transfer failing.
  using Failure = std::function<void(
      int peerRank, bool mismatch, const std::string& message)>;
  // A connection to the rail peer on `machine` failed (with resends only).
  using Broken = std::function<void(int machine, const std::string& message)>;

  struct Expected {
    std::string tag;
    Buffer target;
    std::string what; // for errors: "shards of op #3 slice 0"
    std::function<void()> onArrival;
  };

  // `onBroken` set: resend (see above).
  Lanes(Mesh& mesh, Failure onFailure, Broken onBroken = nullptr);

  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;

  // Queues a message to come from the rail peer on `machine` on `lane`, after
  // every message queued for that peer and lane before it.
  void expect(int machine, Lane lane, Expected expected);
  // Sends `buffer` tagged `tag`, after every message sent to that peer on
  // that lane before it.
  void send(
      int machine,
      Lane lane,
      std::string tag,
      const Buffer& buffer,
      std::string what,
      std::function<void()> onSent,
      std::function<void()> onReleased);
  // Fails every pending transfer (reported as `reason`) and closes the mesh.
  void close(const std::string& reason);
  // Fails as a transfer with the rail peer `peerRank` failing would have.
  void failPeer(int peerRank, const std::string& message);

  bool resends() const {
    return static_cast<bool>(onBroken_);
  }
  // The peer on `machine` has received these many messages from this rank
  // (its "acked" note): their buffers are released.
  void acknowledged(int machine, ReceivedCounts counts);
  // Stops using the connections to `machine`: nothing more is posted on
  // them, and their callbacks are ignored from now on.
  void suspend(int machine);
  // Waits until no callback of the suspended connections to `machine` is
  // pending (so they no longer touch any buffer); false if one still is at
  // `deadline` or once `cancelled()`.
  bool quiesce(
      int machine,
      Clock::time_point deadline,
      const std::function<bool()>& cancelled);
  // What has arrived from `machine` so far.
  ReceivedCounts received(int machine);
  // Goes on with `machine` on the mesh's current connections: resends, in
  // order, every message it has not received (`peerReceived`), then the new
  // ones, and reads the next expected messages.
  void resume(int machine, ReceivedCounts peerReceived);

  const Mesh& mesh() const {
    return mesh_;
  }
  int64_t bytesSent() const {
    return bytesSent_.load();
  }
  int64_t bytesReceived() const {
    return bytesReceived_.load();
  }
  // Messages sent again after a switch.
  int64_t resent() const {
    return resent_.load();
  }

 private:
  struct Outgoing {
    uint64_t number;
    std::string tag;
    Buffer buffer;
    std::string what;
    std::function<void()> onSent;
    std::function<void()> onReleased;
    bool sent = false; // onSent ran
  };
  struct Route {
    std::deque<Expected> expected; // in order
    bool reading = false; // a read for the first is posted
    uint64_t received = 0;
    std::deque<Outgoing> unreleased; // in number order
    uint64_t nextNumber = 0;
    uint64_t nextToPost = 0; // the first number not yet written
    bool posting = false; // a thread writes the unposted ones
  };
  // Everything about one rail peer, guarded by mutex_.
  struct Peer {
    std::array<Route, kLanes> lanes;
    uint64_t epoch = 0; // bumped by suspend: older callbacks are stale
    bool suspended = false;
    int pending = 0; // callbacks due from this epoch's connections
    int draining = 0; // callbacks due from earlier epochs'
    // The acked note in flight, and the counts it carries.
    bool acking = false;
    ReceivedCounts ackedLast;
  };

  class CallbackDone;

  // Posts the read for the first message expected from `machine` on `lane`;
  // its completion posts the next.
  void readNext(int machine, Lane lane);
  // Writes the unposted messages to `machine` on `lane`, in order.
  void post(int machine, Lane lane);
  // Tells the peer what has arrived, unless a note is in flight.
  void ack(int machine);
  // Whether a callback of `epoch` is to be acted on: not stopped, and its
  // connections not replaced since.
  bool current(int machine, uint64_t epoch);
  // A transfer of the current epoch failed.
  void transportFailed(int machine, const std::string& message);
  void fail(int peerRank, const std::string& message, bool mismatch = false);
  void checkPeer(int machine) const;
  // Why `counts` cannot be what the peer on `machine` received, or empty.
  std::string checkCountsLocked(
      int machine, ReceivedCounts counts, const char* how);
  std::string fromPeer(const Expected& expected, int machine, Lane lane) const;
  // Releases the messages to `machine` on `lane` numbered below `count`;
  // returns their callbacks to run outside the lock.
  std::vector<std::function<void()>> releaseLocked(
      int machine, Lane lane, uint64_t count);

  Mesh& mesh_;
  const Failure onFailure_;
  const Broken onBroken_;
  std::atomic<int64_t> bytesSent_{0};
  std::atomic<int64_t> bytesReceived_{0};
  std::atomic<int64_t> resent_{0};
  std::vector<size_t> controlIndex_; // by machine: the rail peer's

  std::mutex mutex_;
  std::condition_variable drained_;
  bool failed_ = false; // guarded by mutex_
  std::vector<Peer> peers_; // by machine; guarded by mutex_
};

} // namespace fairring::rails
