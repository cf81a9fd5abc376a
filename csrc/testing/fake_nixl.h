#pragma once

// Test-only: an in-process fake of NIXL's C API (rails/nixl/library.h), so
// that tests run several NixlMesh objects, one per rank, in one process and
// check the mesh's flow control and trust checks without NIXL. Agents, their
// registered memory, the metadata they loaded and their queues of
// notifications live in one process-wide registry. A posted write copies its
// bytes synchronously, before postXferRequest returns, and only then queues
// its notification: a receiver that sees the notification sees the data.
// Only DRAM moves; GPU memory is refused, as by a backend without CUDA.

#include <cstdint>
#include <string>
#include <vector>

#include "rails/nixl/library.h"

namespace fairring::testing::fake_nixl {

// The fake's errors, numbered as NIXL's C API numbers them, so that
// rails::nixl::statusText names them.
enum Error : int {
  // A null, unknown or wrongly typed handle; metadata the fake did not write
  // or an agent's own; transfer lists that differ; a read, or a memory type
  // other than DRAM and VRAM.
  kInvalidParam = -1,
  // A plugin other than UCX; registering VRAM; a write or notification to an
  // agent that has gone (a peer that exited); a write whose memory is no
  // longer registered, on either side, when it is posted.
  kBackend = -2,
  // A name a live agent already has; the status of a request never posted.
  kInvalidState = -3,
  // A peer whose metadata was not loaded; a transfer outside the registered
  // (or, remotely, described) memory; deregistering what was not registered;
  // a sender a notification map lacks.
  kNotFound = -6,
};

// Counters since the last reset().
struct Stats {
  uint64_t writes = 0; // postXferRequest calls that copied
  uint64_t bytesWritten = 0;
  uint64_t notifications = 0; // by sendNotif; a write's own is not counted
  uint64_t refusedWrites = 0; // createXferRequest or postXferRequest failed
};

// The fake API: every call works on the one process-wide registry of agents.
const rails::nixl::Api& api();

// Forgets every agent and handle and zeroes the stats, between tests. Call it
// with no mesh alive: handles are looked up, so a stale one is refused rather
// than followed, but one whose address a new object reuses is not noticed.
void reset();

// Queues `bytes` for agent `to` as a notification from agent `from`, which
// need not exist, for tests of how a mesh treats strangers and misbehaving
// peers. False if `to` does not exist.
bool inject(
    const std::string& from, const std::string& to, const std::string& bytes);

// The names of the agents alive now, sorted (a mesh names its agent
// "fairring-rank<r>-<hex>").
std::vector<std::string> agents();

Stats stats();

} // namespace fairring::testing::fake_nixl
