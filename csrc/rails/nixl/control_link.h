#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "rails/nixl/data_link.h"
#include "rails/transport.h"

namespace fairring::rails::nixl {

// One neighbour's control connection of the NIXL rails: notes numbered by
// their sender and handed to readers in that order, whatever order NIXL
// delivers them in. No NIXL and no lock (its mesh holds its lock).
class ControlLink {
 public:
  // The sequence number of the next note this rank sends.
  uint64_t nextOut() {
    return nextOut_++;
  }
  // Why the link failed; empty while it works.
  const std::string& broken() const {
    return broken_;
  }

  // Note `seq` from the neighbour: "" or how it breaks the order (a note
  // repeated, behind, or too far ahead).
  std::string arrived(
      uint64_t seq, std::string text, std::vector<Callback>& later);
  // Waits for the next note in order.
  void read(Connection::Note reader, std::vector<Callback>& later);
  // Fails the waiting readers and every later read with `why`.
  void fail(const std::string& why, std::vector<Callback>& later);

 private:
  void deliver(std::vector<Callback>& later);

  uint64_t nextOut_ = 0;
  uint64_t nextIn_ = 0;
  std::map<uint64_t, std::string> early_; // notes ahead of nextIn_
  std::deque<std::string> arrived_;
  std::deque<Connection::Note> readers_;
  std::string broken_;
};

} // namespace fairring::rails::nixl
