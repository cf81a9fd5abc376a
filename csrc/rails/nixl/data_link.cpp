#include "rails/nixl/data_link.h"

#include <utility>

namespace fairring::rails::nixl {

DataLink::Receiving DataLink::receiving() const {
  if (!closed_.empty()) {
    return Receiving::kClosed;
  }
  return read_ ? Receiving::kGranted : Receiving::kIdle;
}

void DataLink::read(
    std::string tag,
    const Buffer& target,
    Connection::Received received,
    LinkEffects& effects) {
  std::string error = closed_;
  if (error.empty() && read_) {
    error = "a read was posted while another was pending";
  }
  if (error.empty() && tag.size() > kMaxTagBytes) {
    error = "a tag of " + std::to_string(tag.size()) + " bytes";
  }
  if (!error.empty()) {
    effects.failed.push_back(
        [received = std::move(received), error] { received(error, "", 0); });
    return;
  }
  const uint64_t seq = nextGrant_++;
  Message grant{
      Kind::kGrant, lane_, seq, addressOf(target.data), target.bytes, tag};
  read_ = Read{seq, std::move(tag), target, std::move(received)};
  effects.steps.emplace_back(SendGrant{std::move(grant)});
}

bool DataLink::write(Write write, LinkEffects& effects) {
  if (!closed_.empty()) {
    effects.failed.push_back(
        [done = std::move(write.done), why = closed_] { done(why); });
    return false;
  }
  writes_.push_back(std::move(write));
  advance(effects);
  return !writes_.empty();
}

std::string DataLink::granted(const Message& grant, LinkEffects& effects) {
  if (!closed_.empty()) {
    return ""; // in flight when it closed
  }
  if (grant.seq < nextWrite_ || grants_.count(grant.seq) ||
      grants_.size() >= kMaxAhead) {
    return "grant " + std::to_string(grant.seq) + " out of order";
  }
  grants_.emplace(grant.seq, Grant{grant.address, grant.bytes, grant.text});
  advance(effects);
  return "";
}

std::string DataLink::ended(const Message& end, Callback& arrival) {
  if (!closed_.empty()) {
    return ""; // in flight when it closed
  }
  if (!read_ || read_->seq != end.seq) {
    return "message " + std::to_string(end.seq) + " arrived unasked for";
  }
  const bool matches =
      end.text == read_->tag && end.bytes == read_->target.bytes;
  if (matches != (end.kind == Kind::kData)) {
    return end.kind == Kind::kData ? "it wrote another message than granted"
                                   : "it declined a message it was granted";
  }
  arrival = [received = std::move(read_->received),
             tag = end.text,
             bytes = end.bytes] { received("", tag, bytes); };
  read_.reset();
  return "";
}

void DataLink::close(const std::string& why, LinkEffects& effects) {
  if (closed_.empty()) {
    closed_ = why;
    advance(effects);
  }
}

void DataLink::advance(LinkEffects& effects) {
  if (!closed_.empty()) {
    if (read_) {
      effects.failed.push_back([received = std::move(read_->received),
                                why = closed_] { received(why, "", 0); });
      read_.reset();
    }
    for (auto& write : writes_) {
      effects.failed.push_back(
          [done = std::move(write.done), why = closed_] { done(why); });
    }
    writes_.clear();
    grants_.clear();
    return;
  }
  // Each queued write whose grant has come, in order.
  for (auto found = grants_.find(nextWrite_);
       !writes_.empty() && found != grants_.end();
       found = grants_.find(nextWrite_)) {
    Grant grant = std::move(found->second);
    grants_.erase(found);
    lastGrant_ = grant;
    strayed_ = false;
    const uint64_t seq = nextWrite_++;
    Write write = std::move(writes_.front());
    writes_.pop_front();
    if (grant.tag == write.tag && grant.bytes == write.buffer.bytes) {
      effects.steps.emplace_back(
          StartWrite{std::move(write), std::move(grant), seq});
    } else {
      // Another message than the receiver expects: nothing is written, and
      // the receiver fails the protocol naming both.
      Message header{
          Kind::kHeader, lane_, seq, 0, write.buffer.bytes, write.tag};
      effects.steps.emplace_back(
          Decline{std::move(header), std::move(write.done)});
    }
  }
}

std::optional<StartWrite> DataLink::strayWrite() {
  if (!closed_.empty() || writes_.empty() || strayed_ || !lastGrant_ ||
      lastGrant_->bytes == 0 ||
      lastGrant_->bytes != writes_.front().buffer.bytes) {
    return std::nullopt;
  }
  strayed_ = true;
  Write stray = writes_.front();
  stray.done = [](const std::string&) {};
  return StartWrite{std::move(stray), *lastGrant_, nextWrite_, /*silent=*/true};
}

} // namespace fairring::rails::nixl
