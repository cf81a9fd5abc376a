#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "rails/tensorpipe/wire.h"
#include "rails/transport.h"
#include "topology.h"

namespace tensorpipe {
class Listener;
class Pipe;
} // namespace tensorpipe

namespace fairring::rails {

// The accepting side of the TensorPipe rails: which peer may connect here on
// which lane, and a listener that admits a pipe only once its hello (wire.h)
// passes a check and its dialler proved it holds the group's rails key
// (handshake.h); any other pipe is closed, noted and logged. The mesh uses it
// at construction (every expected peer) and for each rail switch (one peer).

// The lane number a hello gives for a control connection.
constexpr int kControlLane = kLanes;

// A device index a peer may name: 0 on the CPU; a CUDA device index.
bool plausibleDeviceIndex(int index, bool cuda);

// Whether `rank` connects to this rank, and on which lanes: rail peers on
// lower machines open every lane; ranks of this machine with a lower local
// index open a control connection only.
bool connectsHere(const Topology& topology, int rank, int lane);

// Parses a peer's hello (wire.h) and checks every field against what this
// rank accepts while the mesh is built (exposed for tests). Lane kLanes is
// the control lane. Returns an empty string and sets the outputs if it is
// acceptable, else why not.
std::string checkHello(
    const std::string& hello,
    const Topology& topology,
    bool cuda,
    int& rank,
    int& lane,
    int& deviceIndex);

struct AcceptedPipe {
  Hello hello;
  std::shared_ptr<tensorpipe::Pipe> pipe;
  std::string session; // the handshake's session key (handshake.h)
};

// Pipes accepted so far, and those rejected; written by TensorPipe's loop
// thread, read by the thread waiting for them and, for the rejections, by
// the mesh's describe().
struct Accepted {
  // Why a hello's text is refused, or empty with `hello` set.
  using Check = std::function<std::string(const std::string&, Hello&)>;
  // `where`: whose listener, at which URL, for the log.
  Accepted(Check check, std::string key, std::string where)
      : check(std::move(check)), key(std::move(key)), where(std::move(where)) {}
  const Check check;
  const std::string key; // the group's rails key
  const std::string where;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<AcceptedPipe> pipes;
  // Accepted, neither admitted nor rejected yet: closed when accepting ends,
  // so a stranger that never finishes its handshake holds nothing after.
  std::vector<std::shared_ptr<tensorpipe::Pipe>> unsettled;
  bool ended = false; // closeUnsettled ran: rejections are counted, not logged
  std::set<std::pair<int, int>> seen; // (rank, lane), once proven
  std::vector<std::string> rejections;
  size_t rejected = 0;
  std::string error; // the listener failed

  // Closes `pipe` and notes why (the first few reasons are kept and logged
  // at WARNING).
  void reject(const std::shared_ptr<tensorpipe::Pipe>& pipe, std::string why);
  // Once the listener is closed: closes every pipe still unsettled.
  void closeUnsettled();
  // After the handshake: admits `pipe` for `hello`'s rank and lane if `why`
  // is empty and none was admitted for them yet; else rejects it.
  void admitProven(
      const std::shared_ptr<tensorpipe::Pipe>& pipe,
      const Hello& hello,
      const std::string& why,
      const std::string& session);
  // "rejected N connection(s): [why] ..."; with `mutex` held.
  std::string noted() const;
};

// Accepts pipes until the listener closes: those whose hello passes
// `accepted`'s check and whose dialler proves the key, once per (rank, lane),
// are added to it; the rest are rejected.
void acceptForever(
    const std::shared_ptr<tensorpipe::Listener>& listener,
    const std::shared_ptr<Accepted>& accepted);

} // namespace fairring::rails
