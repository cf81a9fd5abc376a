#include "backend/ledger.h"

#include <charconv>

namespace fairring {

namespace {

// FNV-1a, 64 bits: the same on every rank and platform, unlike std::hash.
uint64_t chained(uint64_t previous, std::string_view signature) {
  uint64_t hash = 14695981039346656037ull;
  const auto mix = [&](unsigned char byte) {
    hash ^= byte;
    hash *= 1099511628211ull;
  };
  for (int shift = 0; shift < 64; shift += 8) {
    mix(static_cast<unsigned char>(previous >> shift));
  }
  for (char c : signature) {
    mix(static_cast<unsigned char>(c));
  }
  return hash;
}

} // namespace

uint64_t CollectiveLedger::record(
    std::string signature, std::optional<Disagreement>& found) {
  std::lock_guard<std::mutex> lock(mutex_);
  chain_ = chained(chain_, signature);
  kept_.push_back(Entry{++issued_, chain_, std::move(signature)});
  if (kept_.size() > kKept) {
    kept_.pop_front();
  }
  for (auto it = ahead_.begin(); it != ahead_.end();) {
    if (it->second.seq == issued_) {
      found = differ(it->first, kept_.back(), it->second);
      it = ahead_.erase(it);
      if (found) {
        break;
      }
    } else {
      ++it;
    }
  }
  return issued_;
}

std::string CollectiveLedger::report() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.empty() ? std::string() : format(kept_.back());
}

uint64_t CollectiveLedger::issued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return issued_;
}

std::optional<CollectiveLedger::Disagreement> CollectiveLedger::compare(
    int neighbour, std::string_view report) {
  Entry theirs;
  if (!parse(report, theirs)) {
    return Disagreement{
        neighbour,
        0,
        {},
        "a malformed collective report '" + std::string(report.substr(0, 80)) +
            "'"};
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (theirs.seq > issued_) {
    ahead_[neighbour] = std::move(theirs); // compared when this rank gets there
    return std::nullopt;
  }
  ahead_.erase(neighbour);
  if (kept_.empty() || theirs.seq < kept_.front().seq) {
    return std::nullopt; // too old to compare
  }
  return differ(neighbour, kept_[theirs.seq - kept_.front().seq], theirs);
}

std::optional<CollectiveLedger::Disagreement> CollectiveLedger::differ(
    int neighbour, const Entry& mine, const Entry& theirs) {
  if (mine.chain == theirs.chain && mine.signature == theirs.signature) {
    return std::nullopt;
  }
  return Disagreement{neighbour, mine.seq, mine.signature, theirs.signature};
}

std::string CollectiveLedger::format(const Entry& entry) {
  char hash[17];
  const auto end = std::to_chars(hash, hash + 16, entry.chain, 16).ptr;
  return std::to_string(entry.seq) + " " + std::string(hash, end) + " " +
      entry.signature;
}

bool CollectiveLedger::parse(std::string_view text, Entry& entry) {
  const size_t first = text.find(' ');
  const size_t second =
      first == std::string_view::npos ? first : text.find(' ', first + 1);
  if (second == std::string_view::npos || first == 0 || second == first + 1 ||
      second + 1 == text.size()) {
    return false;
  }
  const auto number = [](std::string_view digits, uint64_t& value, int base) {
    const auto [end, error] = std::from_chars(
        digits.data(), digits.data() + digits.size(), value, base);
    return error == std::errc() && end == digits.data() + digits.size();
  };
  if (!number(text.substr(0, first), entry.seq, 10) || entry.seq == 0 ||
      !number(text.substr(first + 1, second - first - 1), entry.chain, 16)) {
    return false;
  }
  entry.signature = std::string(text.substr(second + 1));
  return true;
}

} // namespace fairring
