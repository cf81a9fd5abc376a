#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rails/transport.h"

namespace fairring::rails {

// The control protocol, over a Mesh's control connections: how a rank learns
// that a neighbour (a rail peer, or another rank of its machine) has failed,
// and why, without waiting for a timeout.
//
// Three notes travel on a control connection:
//   "alive[ <status>]"           a heartbeat, sent by heartbeat(): the
//                                sender's status (its latest collective,
//                                backend/ledger.h), opaque to the Watch
//   "bye"                        the sender leaves in good order, with no op
//                                of its own pending: not a failure by itself
//   "failed <culprit> <what>"    a failure notice: which rank failed first
//                                (-1: unknown) and what was seen, as text
// Notes of the rails' own ("acked ...", "switch ...": rails/lanes.h,
// rails/failover.h) go to `onRailsNote`.
// A rank that stops announces once, to every neighbour; a rank that learns of
// a failure from a notice stops and announces it in turn, so the notice
// floods the group along rails and machines, and every rank names the same
// culprit. A control connection that fails without a notice means its
// neighbour exited or the link broke; silence (no heartbeat) means it is
// stopped, hung or unreachable. Every note is checked before use.
//
// Threads: handlers run on the transport's thread and must not block; the
// other methods may be called from any thread. The mesh is its owner's, who
// shuts it down (no handler runs after that) before destroying the Watch.
class Watch {
 public:
  using Clock = std::chrono::steady_clock;

  struct Notice {
    int culprit = -1; // a rank of the group; -1 if unknown
    std::string what;
  };
  struct Handlers {
    // A neighbour's failure notice.
    std::function<void(int neighbour, const Notice& notice)> onNotice;
    // A neighbour's control connection failed, or it sent a malformed note.
    std::function<void(int neighbour, const std::string& error)> onLost;
    // A neighbour said goodbye.
    std::function<void(int neighbour)> onBye;
    // A neighbour's heartbeat carried a status; may be empty.
    std::function<void(int neighbour, std::string_view status)> onStatus;
    // Any other note: false if it is not one of the rails' either.
    std::function<bool(int neighbour, const std::string& text)> onRailsNote;
  };

  Watch(Mesh& mesh, int worldSize, Handlers handlers);

  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  // Starts reading every control connection.
  void start();
  // Stops reading neighbours()[index]'s control connection while a rail
  // switch replaces it (rails/failover.h): its callbacks are ignored from
  // now on, its failure included.
  void suspend(size_t index);
  // Reads the new one, counting the silence from now.
  void resume(size_t index);
  // Tells every neighbour this rank is alive, and its `status` if any (one
  // line, at most kMaxNoteBytes in all).
  void heartbeat(const std::string& status);
  // Sends `notice` to every neighbour; only the first call of this or
  // farewell() does.
  void announce(const Notice& notice);
  // Says goodbye to every neighbour; only the first call of this or
  // announce() does.
  void farewell();
  // The neighbours not heard from for `atLeast` (counting from start()), and
  // for how long, in neighbour order.
  std::vector<std::pair<int, Clock::duration>> silences(
      Clock::duration atLeast) const;

  // Parses a failure notice's text (exposed for tests): true and the
  // notice if well-formed, with the culprit in [-1, worldSize).
  static bool parseNotice(
      const std::string& text, int worldSize, Notice& notice);

 private:
  void readNext(size_t index, uint64_t epoch);
  bool current(size_t index, uint64_t epoch) const;

  Mesh& mesh_;
  const int worldSize_;
  const Handlers handlers_;

  mutable std::mutex mutex_;
  bool announced_ = false;
  std::vector<Clock::time_point> lastHeard_; // by neighbour index
  std::vector<uint64_t> epochs_; // by neighbour index: bumped by suspend()
};

} // namespace fairring::rails
