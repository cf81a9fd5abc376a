#pragma once

// Reading and quoting the text a peer sends: TensorPipe's hello and address
// record, NIXL's notifications and staging metadata, the watch's notices.
// All of it is a peer's bytes, read with these and checked before use; the
// formats themselves are written down beside their parsers (nixl/wire.h,
// tensorpipe/mesh.cpp, watch.cpp).

#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace fairring::rails {

// The whole of `text` as a decimal number of type T, or nothing: no spaces,
// no trailing bytes, no sign where T has none, and in T's range.
template <typename T>
std::optional<T> parseDecimal(std::string_view text) {
  T value{};
  const auto [end, error] =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() ||
      end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

// A count, index or rank as this project writes one (std::to_string of a
// value that is never negative): parseDecimal with no sign, and no leading
// zero except in "0" itself, so each value has one spelling.
template <typename T>
std::optional<T> parseCount(std::string_view text) {
  if (text.empty() || text.front() < '0' || text.front() > '9' ||
      (text.size() > 1 && text.front() == '0')) {
    return std::nullopt;
  }
  return parseDecimal<T>(text);
}

// The words between single spaces, with an empty one wherever spaces repeat,
// lead or end the text: a format of a fixed number of words rejects those.
inline std::vector<std::string_view> splitWords(std::string_view text) {
  std::vector<std::string_view> words;
  size_t start = 0;
  while (true) {
    const size_t space = text.find(' ', start);
    words.push_back(text.substr(start, space - start));
    if (space == std::string_view::npos) {
      return words;
    }
    start = space + 1;
  }
}

// Cuts the next word, which a space must end, off the front of `rest`;
// nothing where `rest` holds no space or starts with one (an empty word).
inline std::optional<std::string_view> takeWord(std::string_view& rest) {
  const size_t space = rest.find(' ');
  if (space == std::string_view::npos || space == 0) {
    return std::nullopt;
  }
  const std::string_view word = rest.substr(0, space);
  rest.remove_prefix(space + 1);
  return word;
}

// `text`, which a peer sent, made safe to quote in an error, in at most
// `limit` characters: printable ASCII, tabs and newlines stay (a notice may
// forward a multi-line error), any other byte becomes \xNN.
// Raw, a NUL would cut the error short and a stray byte would make it invalid
// UTF-8, which Python refuses to decode, raising a UnicodeDecodeError in place
// of the error. Printable text within the limit comes back unchanged, so a
// quote forwarded by another rank is not quoted twice.
inline std::string printable(std::string_view text, size_t limit) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string quoted;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    const bool plain = (byte >= 0x20 && byte < 0x7f) || c == '\n' || c == '\t';
    if (quoted.size() + (plain ? 1 : 4) > limit) {
      break;
    }
    if (plain) {
      quoted += c;
    } else {
      quoted += {'\\', 'x', kHex[byte >> 4], kHex[byte & 0xf]};
    }
  }
  return quoted;
}

} // namespace fairring::rails
