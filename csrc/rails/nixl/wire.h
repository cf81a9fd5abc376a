#pragma once

// The messages NIXL rails exchange as NIXL notifications. A notification is
// a peer's bytes: every one is parsed and checked here before use.
//
//   grant  "fairring-nixl G <lane> <seq> <address> <bytes> <tag>"
//          receiver to sender: write message <seq> of <lane> into
//          [address, address + bytes) of my staging, if it is tagged <tag>
//          and exactly <bytes> long
//   data   "fairring-nixl D <lane> <seq> <bytes> <tag>"
//          sender to receiver, delivered by NIXL after the write it ends:
//          message <seq> landed where it was granted
//   header "fairring-nixl H <lane> <seq> <bytes> <tag>"
//          sender to receiver: message <seq> differs from its grant (tag or
//          length), so nothing was written; the receiver fails the protocol
//   note   "fairring-nixl N <seq> <text>"       control note <seq>
//   closed "fairring-nixl C <text>"             the sender closed its data
//          connections to the receiver (Mesh::close), saying why
//
// <seq> counts from 0 per (peer, lane) for data and per peer for notes; NIXL
// does not promise to deliver notifications in order, so receivers order
// them by it. A tag is the rest of its line; a note's text may hold newlines.
//
// Before any of those, each rank publishes its staging record in the
// group's store, which every rail peer reads before it lets NIXL load the
// agent metadata that follows it:
//
//   "fairring-nixl-md 1 <rank> <agent> <memory type> <device id> <address>
//    <bytes>\n" (one line, at most kMaxStagingLineBytes) then NIXL's own
//   metadata of <agent>, opaque bytes
//
// <memory type> is NIXL's, as a number; <address> and <bytes> describe the
// registered staging, neither zero.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fairring::rails::nixl {

enum class Kind : char {
  kGrant = 'G',
  kData = 'D',
  kHeader = 'H',
  kNote = 'N',
  kClosed = 'C',
};

struct Message {
  Kind kind = Kind::kNote;
  int lane = 0; // data kinds
  uint64_t seq = 0; // all but kClosed
  uint64_t address = 0; // kGrant
  uint64_t bytes = 0; // kGrant, kData, kHeader
  std::string text; // the tag; a note's or kClosed's text
};

// A local address as grants and staging records carry it.
inline uint64_t addressOf(const void* data) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data));
}

// Longest tag a grant, data or header message may carry.
constexpr size_t kMaxTagBytes = 256;

std::string encode(const Message& message);

struct StagingRecord {
  uint64_t rank = 0;
  std::string agent;
  uint64_t memoryType = 0;
  uint64_t deviceId = 0;
  uint64_t address = 0;
  uint64_t bytes = 0;
  std::string agentMetadata; // NIXL's, after the line
};

constexpr size_t kMaxStagingLineBytes = 512;

std::string encode(const StagingRecord& record);

// The message in `bytes`, or nullopt with `error` set to why it is not one
// (`lanes`: how many data lanes there are; `maxNoteBytes`: longest text).
std::optional<Message> parse(
    std::string_view bytes, int lanes, size_t maxNoteBytes, std::string& error);

// The staging record in `bytes`, or nullopt with `error` set to why it is
// not one. What it says is the publisher's claim: the reader still checks
// that it names the rank it was published for, a plausible agent and the
// reader's memory type.
std::optional<StagingRecord> parseStagingRecord(
    std::string_view bytes, std::string& error);

} // namespace fairring::rails::nixl
