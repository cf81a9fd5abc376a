#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <c10/core/Event.h>

#include "rails/nixl/wire.h"
#include "rails/transport.h"

namespace fairring::rails::nixl {

using Callback = std::function<void()>;

// Memory a receiver holds for one message: where that message may land.
struct Grant {
  uint64_t address = 0;
  uint64_t bytes = 0;
  std::string tag;
};

// A message its sender asked to write, waiting for its grant.
struct Write {
  std::string tag;
  Buffer buffer;
  Connection::Done done;
  // Recorded on the buffer's stream: the bytes are ready once it completes.
  std::shared_ptr<c10::Event> ready;
};

// What a link asks the mesh to do once the mesh's lock is released.
struct SendGrant {
  Message grant;
};
struct Decline {
  Message header; // the message's own tag and length, for the receiver
  Connection::Done done;
};
struct StartWrite {
  Write write;
  Grant grant;
  uint64_t seq = 0;
  bool silent = false; // no notification: only the ungranted-writes knob's
};
using LinkStep = std::variant<SendGrant, Decline, StartWrite>;

struct LinkEffects {
  std::vector<LinkStep> steps;
  std::vector<Callback> failed; // completions with an error
};

// One (rail peer, lane) data connection of the NIXL rails, both directions:
// the grant protocol of docs/design.md ("NIXL rails") as a value, with no
// NIXL and no lock (its mesh holds its lock around every call).
//
//   receiving:  kIdle --read()--> kGranted --data or header--> kIdle
//   sending:    each write waits, in order, until the grant of its sequence
//               number has come; then it is posted (tag and length match the
//               grant) or declined (they do not), and the next one waits
//   either:     --close()--> kClosed, for good: what was pending fails
//
// Every transition is in advance(), which the events below end with.
class DataLink {
 public:
  enum class Receiving { kIdle, kGranted, kClosed };

  explicit DataLink(int lane) : lane_(lane) {}

  Receiving receiving() const;
  // Why the link closed; empty while it is open.
  const std::string& closed() const {
    return closed_;
  }
  // Something waits for the peer: a granted read or a queued write.
  bool waiting() const {
    return read_.has_value() || !writes_.empty();
  }

  // Reads the next message into `target`: a grant for it goes out.
  void read(
      std::string tag,
      const Buffer& target,
      Connection::Received received,
      LinkEffects& effects);
  // Queues a write for its grant; true if it must wait for it.
  bool write(Write write, LinkEffects& effects);
  // The peer's grant of message `grant.seq`: "" or how it breaks the
  // protocol (a grant repeated, behind, or too far ahead).
  std::string granted(const Message& grant, LinkEffects& effects);
  // The peer's end of the granted read: data (written where granted) or a
  // header (declined). "" with `arrival` set to the reader's completion, or
  // how it breaks the protocol.
  std::string ended(const Message& end, Callback& arrival);
  void close(const std::string& why, LinkEffects& effects);

  // The negative control of the flow-control test (test knob
  // FAIRRING_TEST_NIXL_UNGRANTED_WRITES): the first queued write, once, into
  // the memory the previous grant named, which its receiver may still use.
  std::optional<StartWrite> strayWrite();

 private:
  struct Read {
    uint64_t seq;
    std::string tag;
    Buffer target;
    Connection::Received received;
  };

  void advance(LinkEffects& effects);

  const int lane_;
  std::string closed_;
  // Receiving.
  uint64_t nextGrant_ = 0;
  std::optional<Read> read_;
  // Sending.
  std::deque<Write> writes_;
  uint64_t nextWrite_ = 0;
  std::map<uint64_t, Grant> grants_; // by seq; those ahead of nextWrite_
  // For strayWrite() only.
  std::optional<Grant> lastGrant_;
  bool strayed_ = false;
};

// At most this many grants or notes a peer may send ahead of what is due.
constexpr size_t kMaxAhead = 1024;

} // namespace fairring::rails::nixl
