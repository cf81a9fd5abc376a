#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/nixl/peers.h"

#include <cctype>

#include <c10/util/Exception.h>

#include "rails/auth/sealed.h"

namespace fairring::rails::nixl {

bool inside(uint64_t base, uint64_t size, uint64_t address, uint64_t bytes) {
  return address >= base && bytes <= size && address - base <= size - bytes;
}

bool Peer::holds(uint64_t address, uint64_t bytes) const {
  return inside(stagingBase, stagingBytes, address, bytes);
}

bool plausibleAgentName(std::string_view name) {
  if (name.empty() || name.size() > 128 || name.substr(0, 9) != "fairring-") {
    return false;
  }
  for (const char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-')) {
      return false;
    }
  }
  return true;
}

std::string refuseRecord(
    const StagingRecord& record, int rank, MemoryType memoryType) {
  if (record.rank != static_cast<uint64_t>(rank)) {
    return "it names another rank";
  }
  if (!plausibleAgentName(record.agent)) {
    return "its agent name is not one fairring makes";
  }
  if (record.memoryType != static_cast<uint64_t>(memoryType)) {
    return "its staging is on another device type";
  }
  return "";
}

namespace {

// Waits for every key; throws naming the ranks whose key never came.
void awaitRecords(
    c10d::Store& store,
    const std::vector<std::string>& keys,
    const std::vector<int>& neighbours,
    const std::string& prefix,
    int rank,
    std::chrono::milliseconds timeout) {
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    std::string missing;
    for (size_t index = 0; index < keys.size(); ++index) {
      if (!store.check({keys[index]})) {
        missing +=
            (missing.empty() ? "" : ", ") + std::to_string(neighbours[index]);
      }
    }
    TORCH_CHECK_WITH(
        DistStoreError,
        false,
        "fairring: timed out after ",
        timeout.count(),
        " ms on rank ",
        rank,
        " waiting for the NIXL agent metadata of ranks ",
        missing.empty() ? std::string("(all arrived at the end)") : missing,
        " (store keys ",
        prefix,
        "<rank>): they have not made their engine. Check that every rank "
        "issued the same all-reduce, with FAIRRING_RAILS_TRANSPORT=nixl");
  }
}

} // namespace

std::vector<Peer> exchangeStagingRecords(
    c10d::Store& store,
    const std::string& prefix,
    const std::string& key,
    const StagingRecord& own,
    const std::vector<int>& neighbours,
    Agent& agent,
    std::chrono::milliseconds timeout) {
  const int rank = static_cast<int>(own.rank);
  const std::string ownKey = prefix + std::to_string(rank);
  const std::string published = auth::sealForStore(key, ownKey, encode(own));
  store.set(ownKey, std::vector<uint8_t>(published.begin(), published.end()));
  if (neighbours.empty()) {
    return {};
  }
  // Every neighbour's, in one store round trip once all are published, and
  // checked before NIXL sees it.
  std::vector<std::string> keys;
  for (const int peer : neighbours) {
    keys.push_back(prefix + std::to_string(peer));
  }
  awaitRecords(store, keys, neighbours, prefix, rank, timeout);
  const auto values = store.multiGet(keys);
  std::vector<Peer> peers;
  for (size_t index = 0; index < neighbours.size(); ++index) {
    const int peer = neighbours[index];
    const auto text = auth::openFromStore(
        key,
        keys[index],
        std::string_view(
            reinterpret_cast<const char*>(values[index].data()),
            values[index].size()));
    std::string why = text ? ""
                           : "it is not sealed with this group's rails key (a "
                             "forged or moved record, or a rank with another "
                             "FAIRRING_RAILS_SECRET)";
    const auto record = text ? parseStagingRecord(*text, why) : std::nullopt;
    if (record) {
      why =
          refuseRecord(*record, peer, static_cast<MemoryType>(own.memoryType));
    }
    if (why.empty()) {
      why = agent.loadPeer(record->agentMetadata, record->agent);
    }
    TORCH_CHECK(
        why.empty(),
        "fairring: the NIXL agent metadata rank ",
        peer,
        " published (store key ",
        keys[index],
        ") was refused on rank ",
        rank,
        ": ",
        why,
        ". Check that every rank runs the same fairring and NIXL, with "
        "FAIRRING_RAILS_TRANSPORT=nixl, and that nothing else writes to the "
        "group's store");
    peers.push_back(
        Peer{
            peer,
            record->agent,
            record->address,
            record->bytes,
            record->deviceId});
  }
  return peers;
}

} // namespace fairring::rails::nixl
