#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rails/lanes.h"
#include "rails/transport.h"
#include "rails/watch.h"
#include "topology.h"

namespace fairring::rails {

// Rails that fail over (docs/design.md, "Rails that fail over"): when the
// interface a rank's rails listen on goes down, its connections to its rail
// peers move to a spare interface of its machine (one the machine's other
// rails use), and back once it is up again. The messages a peer lacks are
// sent again (Lanes' resends), so the ops in flight complete, unchanged.
//
// A switch replaces the data and control connections of one pair of rail
// peers, and both sides run it: suspend the pair's lanes and watch, close
// the connections, wait until their callbacks are done (quiesce), then
// reconnect through the mesh (the higher machine listens, the lower dials,
// meeting in the store) exchanging what each has received, and resume.
// Each pair numbers its switches; both sides start switch g + 1 when
//   - this rank's own interface is down (it polls its state), and it then
//     tells the peer with a "switch" note relayed through another rail: a
//     local neighbour, that neighbour's rail peer on the peer's machine,
//     then the peer (the direct connections no longer carry anything);
//   - that note arrives;
//   - the peer has been silent for `silenceLimit`, which also covers a note
//     that never came;
//   - a connection to the peer breaks while this rank's interface is down.
// A connection that breaks otherwise (the peer exited) fails as it always
// did, once `brokenGrace` has passed with no note to explain it. A switch
// that does not complete within `switchLimit` leaves the pair suspended: its
// ops then time out, naming the interface that is down.
//
// Notes: "switch <origin> <target> <machine> <rail> <number> <to>": the
// target's place (a rank knows only its machine's ranks and its rail peers,
// so each hop routes by place), and <to>, "spare" or "own", the interface the
// listening side listens on; forwarded by each hop towards <target>.
//
// Threads: a monitor thread (interface state, silences, unexplained breaks)
// and up to eight switch threads, all owned here and joined by shutdown(),
// which the engine calls before the mesh shuts down.
// broken() and onNote() run on the transport's thread and only queue.
class RailFailover {
 public:
  using Clock = std::chrono::steady_clock;

  struct Settings {
    Clock::duration switchLimit;
    Clock::duration silenceLimit;
    Clock::duration brokenGrace;
    Clock::duration pollInterval;
  };
  struct Hooks {
    // A line for the log: a warning, or information.
    std::function<void(const std::string& line, bool warning)> log;
  };

  RailFailover(
      Mesh& mesh,
      Lanes& lanes,
      Watch& watch,
      const Topology& topology,
      Settings settings,
      Hooks hooks);
  ~RailFailover();

  RailFailover(const RailFailover&) = delete;
  RailFailover& operator=(const RailFailover&) = delete;

  // Whether `mesh` can switch at all: it has a spare interface.
  static bool possible(const Mesh& mesh);

  // No switch starts after this; one in progress gives up. From any thread.
  void cancel();
  // Cancels, then joins the threads (not from one of them). Idempotent.
  void shutdown();
  // The group's timeout changed (set_timeout): these timings from now on.
  void retime(Settings settings);
  // A connection to the rail peer on `machine` broke: a switch explains it,
  // else `fail` runs (on the monitor thread) after brokenGrace.
  void broken(int machine, std::function<void()> fail);
  // A control note of the rails' from `neighbour`: false if it is not a
  // well-formed switch note.
  bool onNote(int neighbour, const std::string& text);
  // Where each rail peer's connections are, and the switches so far.
  std::string describe() const;

 private:
  enum class To { kSpare, kOwn };
  struct Pair {
    uint64_t generation = 0; // the last switch started
    std::string interface; // this side's, for the pair's connections
    bool queued = false; // a switch waits for a worker
    bool switching = false;
    To to = To::kSpare;
    bool movedOff = false; // this rank moved it: its interface went down
    bool stuck = false; // a switch failed: left suspended
    std::optional<Clock::time_point> brokenAt;
    std::function<void()> fail;
  };

  void monitor();
  void work();
  // Queues switch `generation` with the peer on `machine` unless one that
  // late is queued already; with mutex_ held. Returns the note to send the
  // peer (target rank, text) if `relay`, for send() once unlocked.
  std::vector<std::pair<int, std::string>> requestLocked(
      int machine, uint64_t generation, To to, bool relay);
  void send(const std::vector<std::pair<int, std::string>>& notes);
  void run(int machine, uint64_t generation, To to);
  // Sends `origin`'s switch note one hop towards the rank at `targetRail`
  // on `targetMachine`; false if there is no such hop from here.
  bool forward(
      int origin, int targetMachine, int targetRail, const std::string& text);
  std::string spareUp() const; // the first spare that is up, or empty
  size_t controlIndex(int rank) const;
  bool stopping() const;

  Mesh& mesh_;
  Lanes& lanes_;
  Watch& watch_;
  const Topology topology_;
  const Hooks hooks_;
  const std::string own_; // this rank's interface
  const std::vector<std::string> spares_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  Settings settings_; // guarded by mutex_ (retime)
  bool stopping_ = false;
  std::vector<Pair> pairs_; // by machine
  std::deque<int> queue_; // machines with a switch to run
  bool ownDown_ = false;
  std::optional<Clock::time_point> ownUpSince_; // since it came back
  int switches_ = 0;
  std::string lastEvent_;

  std::thread monitor_;
  std::vector<std::thread> workers_;
};

} // namespace fairring::rails
