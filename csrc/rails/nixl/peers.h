#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "rails/nixl/agent.h"
#include "rails/nixl/wire.h"

namespace fairring::rails::nixl {

// [address, address + bytes) lies in [base, base + size).
bool inside(uint64_t base, uint64_t size, uint64_t address, uint64_t bytes);

// A neighbour as its staging record described it, once checked and loaded.
struct Peer {
  int rank = -1;
  std::string agent;
  uint64_t stagingBase = 0;
  uint64_t stagingBytes = 0;
  uint64_t deviceId = 0;

  // [address, address + bytes) lies in this peer's staging.
  bool holds(uint64_t address, uint64_t bytes) const;
};

// A name fairring gives its agents: "fairring-" then letters, digits, '-'.
bool plausibleAgentName(std::string_view name);

// Why `record`, published for `rank`, must not be used ("" if it may): the
// grammar is wire.h's; these are the checks that need the reader's view.
std::string refuseRecord(
    const StagingRecord& record, int rank, MemoryType memoryType);

// Publishes `own` under `prefix` in the store, sealed with the group's rails
// key (rails/auth/sealed.h), then reads every neighbour's record there, opens
// and checks it and lets `agent` load its metadata: the peers, by neighbour
// index. Throws naming the ranks that did not publish within `timeout`, or
// the record that was refused and why.
std::vector<Peer> exchangeStagingRecords(
    c10d::Store& store,
    const std::string& prefix,
    const std::string& key,
    const StagingRecord& own,
    const std::vector<int>& neighbours,
    Agent& agent,
    std::chrono::milliseconds timeout);

} // namespace fairring::rails::nixl
