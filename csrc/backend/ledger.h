#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace fairring {

// The collectives a rank has issued in its group, for comparing with its
// neighbours': ranks that called different collectives (a different op, or an
// all-reduce of another size, dtype or reduction) wait on each other in
// different places, possibly on different paths (the engine and Gloo), and
// would otherwise meet only at a timeout.
//
// Each collective gets the next sequence number and a signature, the part of
// its arguments every rank must give alike ("all_reduce cpu Float[4096]
// sum"). A chain hash over all signatures so far makes one report stand for
// the whole sequence: a report of collective #n whose hash differs from this
// rank's #n proves the two sequences differ at or before #n. Reports travel
// on heartbeats (rails::Watch); a report ahead of this rank is kept until
// this rank issues that collective. Detection is as late as a heartbeat, and
// only a difference that both ranks have issued by then can be seen: a rank
// that waits reports the collective it waits in.
//
// Thread-safe.
class CollectiveLedger {
 public:
  // Two ranks' collectives differ at or before `seq`.
  struct Disagreement {
    int neighbour;
    uint64_t seq;
    std::string mine; // this rank's signature of #seq
    std::string theirs; // the neighbour's
  };

  // Records the next collective, returning its sequence number (from 1), and
  // any disagreement with a neighbour's report of it that came early.
  uint64_t record(std::string signature, std::optional<Disagreement>& found);

  // The report of the latest collective ("" before the first): its number,
  // hash and signature.
  std::string report() const;

  // Compares a neighbour's report with this rank's sequence. A malformed
  // report is a disagreement too (`theirs` quotes it).
  std::optional<Disagreement> compare(int neighbour, std::string_view report);

  uint64_t issued() const;

  // How many collectives back a report can still be compared.
  static constexpr size_t kKept = 4096;

 private:
  struct Entry {
    uint64_t seq = 0;
    uint64_t chain = 0;
    std::string signature;
  };
  static std::string format(const Entry& entry);
  static bool parse(std::string_view text, Entry& entry);
  static std::optional<Disagreement> differ(
      int neighbour, const Entry& mine, const Entry& theirs);

  mutable std::mutex mutex_;
  std::deque<Entry> kept_; // the latest kKept, oldest first
  uint64_t chain_ = 0;
  uint64_t issued_ = 0;
  std::map<int, Entry>
      ahead_; // by neighbour: a report this rank has not reached
};

} // namespace fairring
