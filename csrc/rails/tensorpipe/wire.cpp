#include "rails/tensorpipe/wire.h"

#include "rails/peer_text.h"

namespace fairring::rails {

namespace {

constexpr std::string_view kHello = "fairring-rails-hello";
constexpr std::string_view kUrlScheme = "uv://";

// Visible ASCII only: no spaces, controls or bytes above 0x7e.
bool graphic(std::string_view word) {
  for (const char c : word) {
    if (c < 0x21 || c > 0x7e) {
      return false;
    }
  }
  return true;
}

// An int as encode() writes it: no '+', no leading zero, no "-0".
std::optional<int> integer(std::string_view word) {
  const std::string_view digits = word.starts_with('-') ? word.substr(1) : word;
  if (digits.starts_with('0') && (digits.size() > 1 || digits != word)) {
    return std::nullopt;
  }
  return parseDecimal<int>(word);
}

std::string counts(const ReceivedCounts& received) {
  return std::to_string(received.shards) + " " +
      std::to_string(received.reduced);
}

bool wellFormedUrl(std::string_view url) {
  return url.starts_with(kUrlScheme) && url.size() > kUrlScheme.size() &&
      graphic(url);
}

} // namespace

std::string encode(const Hello& hello) {
  std::string text = std::string(kHello) + " " + std::to_string(hello.rank) +
      " " + std::to_string(hello.lane) + " " +
      std::to_string(hello.deviceIndex);
  if (hello.generation > 0) {
    text +=
        " " + std::to_string(hello.generation) + " " + counts(hello.received);
  }
  return text;
}

std::optional<Hello> parseHello(std::string_view text, std::string& error) {
  const auto words = splitWords(text);
  std::optional<int> fields[3];
  std::optional<uint64_t> switched[3] = {0, 0, 0};
  if ((words.size() == 4 || words.size() == 7) && words[0] == kHello) {
    for (int i = 0; i < 3; ++i) {
      fields[i] = integer(words[i + 1]);
    }
    if (words.size() == 7) {
      for (int i = 0; i < 3; ++i) {
        switched[i] = parseCount<uint64_t>(words[i + 4]);
      }
    }
  }
  const auto& [rank, lane, deviceIndex] = fields;
  const auto& [generation, shards, reduced] = switched;
  if (!rank || !lane || !deviceIndex || !generation || !shards || !reduced ||
      (words.size() == 7 && *generation == 0)) {
    error = "a connection did not open with fairring's hello (got '" +
        printable(text, 80) + "')";
    return std::nullopt;
  }
  return Hello{*rank, *lane, *deviceIndex, *generation, {*shards, *reduced}};
}

std::string encode(const AddressRecord& record) {
  return std::to_string(record.deviceIndex) + " " + record.url;
}

std::optional<AddressRecord> parseAddressRecord(
    std::string_view text, std::string& error) {
  const auto words = splitWords(text);
  const auto deviceIndex = words.size() == 2 ? integer(words[0]) : std::nullopt;
  if (text.size() > kMaxAddressRecordBytes || !deviceIndex ||
      !wellFormedUrl(words[1])) {
    error = "a malformed address '" + printable(text, 200) + "'";
    return std::nullopt;
  }
  return AddressRecord{*deviceIndex, std::string(words[1])};
}

std::string encode(const SwitchRecord& record) {
  return std::to_string(record.deviceIndex) + " " + counts(record.received) +
      " " + record.url;
}

std::optional<SwitchRecord> parseSwitchRecord(
    std::string_view text, std::string& error) {
  const auto words = splitWords(text);
  const bool four = words.size() == 4;
  const auto deviceIndex = four ? integer(words[0]) : std::nullopt;
  const auto shards = four ? parseCount<uint64_t>(words[1]) : std::nullopt;
  const auto reduced = four ? parseCount<uint64_t>(words[2]) : std::nullopt;
  if (text.size() > kMaxAddressRecordBytes || !deviceIndex || !shards ||
      !reduced || !wellFormedUrl(words[3])) {
    error = "a malformed switch record '" + printable(text, 200) + "'";
    return std::nullopt;
  }
  return SwitchRecord{*deviceIndex, {*shards, *reduced}, std::string(words[3])};
}

} // namespace fairring::rails
