#pragma once

// Test-only: two NIXL meshes, ranks 0 and 1 on machines 0 and 1, in this one
// process over the fake NIXL (fake_nixl.h), driven op by op from Python, so
// that the mesh's flow control and trust checks run without NIXL: the
// misbehaving peer is a test that injects notifications in rank 0's name.

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "config.h"
#include "rails/transport.h"
#include "topology.h"

namespace fairring::testing {

class FakeNixlPair {
 public:
  struct Outcome {
    bool finished = false;
    std::string error;
    std::string tag; // reads and notes: what arrived
    size_t bytes = 0;
    std::string data; // reads: the target's bytes when the read completed
  };

  // Each rank's staging is `stagingBytes`; the knobs are rails/nixl/mesh.h's
  // TestKnobs, on both ranks.
  FakeNixlPair(size_t stagingBytes, int slowReceiverMs, bool ungrantedWrites);
  ~FakeNixlPair();
  FakeNixlPair(const FakeNixlPair&) = delete;
  FakeNixlPair& operator=(const FakeNixlPair&) = delete;

  std::string agent(int rank) const;
  // Where `rank`'s staging lies, for grants a test forges.
  uint64_t stagingAddress(int rank) const;
  // Fills [offset, offset + bytes) of `rank`'s staging with `fill`, then
  // writes it to the other rank on the shards lane, tagged `tag`. An op id.
  int send(int rank, std::string tag, size_t offset, size_t bytes, int fill);
  // Reads the next message on `rank` into [offset, offset + bytes) of its
  // staging; the completion copies the target, as the engine would reduce it.
  int receive(int rank, std::string tag, size_t offset, size_t bytes);
  int sendNote(int rank, std::string text);
  int readNote(int rank);
  // The op's outcome once it finished, or unfinished after `seconds`.
  Outcome wait(int id, double seconds);
  // A notification to `rank` that seems to come from agent `from`.
  bool inject(const std::string& from, int rank, const std::string& bytes);
  std::string describe(int rank) const;
  // Shuts both meshes down (what is pending fails) and forgets the fake's
  // agents; the destructor does it if no one did.
  void shutdown();

 private:
  std::shared_ptr<Outcome> start(int& id);
  void finish(const std::shared_ptr<Outcome>& outcome, Outcome result);
  rails::Buffer slice(int rank, size_t offset, size_t bytes);

  c10::intrusive_ptr<c10d::Store> store_;
  RailsNetwork network_;
  std::vector<Topology> topologies_;
  std::vector<std::vector<char>> staging_;
  std::vector<std::unique_ptr<rails::Mesh>> meshes_;
  std::mutex mutex_;
  std::condition_variable finished_;
  std::map<int, std::shared_ptr<Outcome>> ops_;
  int nextId_ = 0;
};

} // namespace fairring::testing
