#include "rails/nixl/control_link.h"

#include <utility>

namespace fairring::rails::nixl {

std::string ControlLink::arrived(
    uint64_t seq, std::string text, std::vector<Callback>& later) {
  if (!broken_.empty()) {
    return "";
  }
  if (seq < nextIn_ || early_.count(seq) || early_.size() >= kMaxAhead) {
    return "note " + std::to_string(seq) + " out of order";
  }
  early_.emplace(seq, std::move(text));
  for (auto next = early_.find(nextIn_); next != early_.end();
       next = early_.find(nextIn_)) {
    arrived_.push_back(std::move(next->second));
    early_.erase(next);
    ++nextIn_;
  }
  deliver(later);
  return "";
}

void ControlLink::read(Connection::Note reader, std::vector<Callback>& later) {
  if (!broken_.empty()) {
    later.push_back(
        [reader = std::move(reader), why = broken_] { reader(why, ""); });
    return;
  }
  readers_.push_back(std::move(reader));
  deliver(later);
}

void ControlLink::fail(const std::string& why, std::vector<Callback>& later) {
  if (broken_.empty()) {
    broken_ = why;
  }
  for (auto& reader : readers_) {
    later.push_back(
        [reader = std::move(reader), why = broken_] { reader(why, ""); });
  }
  readers_.clear();
}

void ControlLink::deliver(std::vector<Callback>& later) {
  while (!arrived_.empty() && !readers_.empty()) {
    later.push_back([reader = std::move(readers_.front()),
                     text = std::move(arrived_.front())] { reader("", text); });
    readers_.pop_front();
    arrived_.pop_front();
  }
}

} // namespace fairring::rails::nixl
