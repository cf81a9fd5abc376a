#include "rails/nixl/wire.h"

#include <algorithm>

#include "rails/peer_text.h"

namespace fairring::rails::nixl {

namespace {

constexpr std::string_view kPrefix = "fairring-nixl ";
constexpr std::string_view kStagingMagic = "fairring-nixl-md 1 ";

std::optional<uint64_t> number(std::optional<std::string_view> text) {
  return text ? parseDecimal<uint64_t>(*text) : std::nullopt;
}

bool dataKind(Kind kind) {
  return kind == Kind::kGrant || kind == Kind::kData || kind == Kind::kHeader;
}

} // namespace

std::string encode(const Message& message) {
  std::string out(kPrefix);
  out += static_cast<char>(message.kind);
  out += ' ';
  if (dataKind(message.kind)) {
    out += std::to_string(message.lane) + ' ';
  }
  if (message.kind != Kind::kClosed) {
    out += std::to_string(message.seq) + ' ';
  }
  if (message.kind == Kind::kGrant) {
    out += std::to_string(message.address) + ' ';
  }
  if (dataKind(message.kind)) {
    out += std::to_string(message.bytes) + ' ';
  }
  out += message.text;
  return out;
}

std::optional<Message> parse(
    std::string_view bytes,
    int lanes,
    size_t maxNoteBytes,
    std::string& error) {
  const auto fail = [&](std::string why) -> std::optional<Message> {
    error = std::move(why);
    return std::nullopt;
  };
  if (bytes.size() > kPrefix.size() + 96 + maxNoteBytes) {
    return fail("a notification of " + std::to_string(bytes.size()) + " bytes");
  }
  if (bytes.substr(0, kPrefix.size()) != kPrefix) {
    return fail("a notification that is not fairring's");
  }
  std::string_view rest = bytes.substr(kPrefix.size());
  const auto kindWord = takeWord(rest);
  if (!kindWord || kindWord->size() != 1) {
    return fail("a notification of no known kind");
  }
  Message message;
  message.kind = static_cast<Kind>((*kindWord)[0]);
  switch (message.kind) {
    case Kind::kGrant:
    case Kind::kData:
    case Kind::kHeader:
    case Kind::kNote:
    case Kind::kClosed:
      break;
    default:
      return fail("a notification of no known kind");
  }
  if (dataKind(message.kind)) {
    const auto lane = number(takeWord(rest));
    if (!lane || *lane >= static_cast<uint64_t>(lanes)) {
      return fail("a data notification with no valid lane");
    }
    message.lane = static_cast<int>(*lane);
  }
  if (message.kind != Kind::kClosed) {
    const auto seq = number(takeWord(rest));
    if (!seq) {
      return fail("a notification with no sequence number");
    }
    message.seq = *seq;
  }
  if (message.kind == Kind::kGrant) {
    const auto address = number(takeWord(rest));
    if (!address || *address == 0) {
      return fail("a grant with no valid address");
    }
    message.address = *address;
  }
  if (dataKind(message.kind)) {
    const auto length = number(takeWord(rest));
    if (!length) {
      return fail("a data notification with no valid length");
    }
    message.bytes = *length;
    if (rest.empty() || rest.size() > kMaxTagBytes) {
      return fail(
          "a data notification with a tag of " + std::to_string(rest.size()) +
          " bytes");
    }
  } else if (rest.size() > maxNoteBytes) {
    return fail("a note of " + std::to_string(rest.size()) + " bytes");
  }
  message.text = std::string(rest);
  return message;
}

std::string encode(const StagingRecord& record) {
  return std::string(kStagingMagic) + std::to_string(record.rank) + ' ' +
      record.agent + ' ' + std::to_string(record.memoryType) + ' ' +
      std::to_string(record.deviceId) + ' ' + std::to_string(record.address) +
      ' ' + std::to_string(record.bytes) + '\n' + record.agentMetadata;
}

std::optional<StagingRecord> parseStagingRecord(
    std::string_view bytes, std::string& error) {
  const size_t newline = bytes.find('\n');
  const auto words =
      splitWords(bytes.substr(0, std::min(newline, kMaxStagingLineBytes)));
  // The magic is two words, then six fields.
  if (newline == std::string_view::npos || newline > kMaxStagingLineBytes ||
      !bytes.starts_with(kStagingMagic) || words.size() != 8) {
    error = "it is not fairring's NIXL metadata";
    return std::nullopt;
  }
  StagingRecord record;
  const auto rank = parseDecimal<uint64_t>(words[2]);
  const auto memoryType = parseDecimal<uint64_t>(words[4]);
  const auto deviceId = parseDecimal<uint64_t>(words[5]);
  const auto address = parseDecimal<uint64_t>(words[6]);
  const auto length = parseDecimal<uint64_t>(words[7]);
  if (!rank || words[3].empty() || !memoryType) {
    error = "it is not fairring's NIXL metadata";
    return std::nullopt;
  }
  if (!deviceId || !address || !length || *address == 0 || *length == 0) {
    error = "its staging is not described";
    return std::nullopt;
  }
  record.rank = *rank;
  record.agent = std::string(words[3]);
  record.memoryType = *memoryType;
  record.deviceId = *deviceId;
  record.address = *address;
  record.bytes = *length;
  record.agentMetadata = std::string(bytes.substr(newline + 1));
  return record;
}

} // namespace fairring::rails::nixl
