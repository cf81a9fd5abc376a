#pragma once

// The texts the TensorPipe rails exchange before any data. Both are a
// peer's bytes: each is parsed here, by its grammar, before use; what a
// value means for the reader (is this rank a peer that connects here, is
// the device index one this rank can use) is the mesh's to check.
//
//   hello    "fairring-rails-hello <rank> <lane> <device index>"
//            the metadata of the first message on a pipe: who opened it,
//            for which lane (kLanes: the control lane), with its buffers on
//            which device index; after a rail switch (rails/failover.h) it
//            goes on " <switch> <received shards> <received reduced>": the
//            switch's number (1 and up) and how many messages the sender
//            has received from the listener on each lane so far
//   address  "<device index> <url>"
//            what each rank publishes in the group's store (key url/<rank>):
//            its device index and the URL its listener took, "uv://..."
//   switch   "<device index> <received shards> <received reduced> <url>"
//            what the listening side of a rail switch publishes: the same,
//            and the listener's received counts, as a hello gives them
//
// Numbers are decimal ints, with no '+', leading zero or "-0"; words are
// separated by single spaces; nothing comes before or after. So a text
// parses only as encode() writes it. A negative rank, lane or device index
// is the grammar's, and the reader's checks refuse it.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "rails/transport.h"

namespace fairring::rails {

struct Hello {
  int rank = 0;
  int lane = 0;
  int deviceIndex = 0;
  uint64_t generation = 0; // 0: the mesh's first connection, not a switch
  ReceivedCounts received; // only with a generation
};

std::string encode(const Hello& hello);
// The hello in `text`, or nullopt with `error` set to why it is not one.
std::optional<Hello> parseHello(std::string_view text, std::string& error);

struct AddressRecord {
  int deviceIndex = 0;
  std::string url;
};

// Longest address record a peer may publish.
constexpr size_t kMaxAddressRecordBytes = 512;

std::string encode(const AddressRecord& record);
// The record in `text`, or nullopt with `error` set to why it is not one.
std::optional<AddressRecord> parseAddressRecord(
    std::string_view text, std::string& error);

struct SwitchRecord {
  int deviceIndex = 0;
  ReceivedCounts received;
  std::string url;
};

std::string encode(const SwitchRecord& record);
// The record in `text`, or nullopt with `error` set to why it is not one.
std::optional<SwitchRecord> parseSwitchRecord(
    std::string_view text, std::string& error);

} // namespace fairring::rails
