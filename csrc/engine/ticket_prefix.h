#pragma once

#include <cstdint>
#include <set>

namespace fairring {

// Which slice tickets (1, 2, ...) are done, as the greatest ticket up to
// which every one is: the value a signal of a device that launches ahead
// carries (DeviceContext::raiseSignal), since slices are done out of order
// (one machine's bytes come before another's) and a wait for ticket t
// passes on any value from t up. Not thread-safe: the engine's mutex_.
class TicketPrefix {
 public:
  // `ticket` is done (once); returns the new prefix.
  uint64_t complete(uint64_t ticket) {
    if (ticket != prefix_ + 1) {
      later_.insert(ticket);
      return prefix_;
    }
    ++prefix_;
    while (!later_.empty() && *later_.begin() == prefix_ + 1) {
      later_.erase(later_.begin());
      ++prefix_;
    }
    return prefix_;
  }
  // Whether every ticket up to `ticket` is done (0: none asked for).
  bool reached(uint64_t ticket) const {
    return ticket <= prefix_;
  }
  uint64_t prefix() const {
    return prefix_;
  }

 private:
  uint64_t prefix_ = 0;
  std::set<uint64_t> later_; // done, beyond a ticket not yet done
};

} // namespace fairring
