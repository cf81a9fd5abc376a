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

} // namespace

std::string encode(const Hello& hello) {
  return std::string(kHello) + " " + std::to_string(hello.rank) + " " +
      std::to_string(hello.lane) + " " + std::to_string(hello.deviceIndex);
}

std::optional<Hello> parseHello(std::string_view text, std::string& error) {
  const auto words = splitWords(text);
  std::optional<int> fields[3];
  if (words.size() == 4 && words[0] == kHello) {
    for (int i = 0; i < 3; ++i) {
      fields[i] = integer(words[i + 1]);
    }
  }
  const auto& [rank, lane, deviceIndex] = fields;
  if (!rank || !lane || !deviceIndex) {
    error = "a connection did not open with fairring's hello (got '" +
        printable(text, 80) + "')";
    return std::nullopt;
  }
  return Hello{*rank, *lane, *deviceIndex};
}

std::string encode(const AddressRecord& record) {
  return std::to_string(record.deviceIndex) + " " + record.url;
}

std::optional<AddressRecord> parseAddressRecord(
    std::string_view text, std::string& error) {
  const auto words = splitWords(text);
  const auto deviceIndex = words.size() == 2 ? integer(words[0]) : std::nullopt;
  if (text.size() > kMaxAddressRecordBytes || !deviceIndex ||
      !words[1].starts_with(kUrlScheme) ||
      words[1].size() == kUrlScheme.size() || !graphic(words[1])) {
    error = "a malformed address '" + printable(text, 200) + "'";
    return std::nullopt;
  }
  return AddressRecord{*deviceIndex, std::string(words[1])};
}

} // namespace fairring::rails
