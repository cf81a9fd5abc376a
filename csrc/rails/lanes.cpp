#include "rails/lanes.h"

#include <c10/util/Exception.h>

namespace fairring::rails {

namespace {
const char* laneName(Lane lane) {
  return lane == kShards ? "shards lane" : "reduced lane";
}
} // namespace

Lanes::Lanes(Mesh& mesh, Failure onFailure)
    : mesh_(mesh),
      onFailure_(std::move(onFailure)),
      expected_(mesh_.numMachines()),
      reading_(mesh_.numMachines(), {false, false}) {}

std::string Lanes::fromPeer(
    const Expected& expected, int machine, Lane lane) const {
  return expected.what + " from rail peer rank " +
      std::to_string(mesh_.peerRank(machine)) + " (" + laneName(lane) + ")";
}

bool Lanes::stopped() {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

void Lanes::checkPeer(int machine) const {
  TORCH_CHECK(
      machine >= 0 && machine < mesh_.numMachines() &&
          machine != mesh_.machine(),
      "fairring: no rail peer on machine ",
      machine,
      " (this rank is on machine ",
      mesh_.machine(),
      " of ",
      mesh_.numMachines(),
      ")");
}

void Lanes::expect(int machine, Lane lane, Expected expected) {
  checkPeer(machine);
  bool idle = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) {
      return;
    }
    expected_[machine][lane].push_back(std::move(expected));
    idle = !std::exchange(reading_[machine][lane], true);
  }
  // The transport may run callbacks inline: never call it under mutex_.
  if (idle) {
    readNext(machine, lane);
  }
}

void Lanes::readNext(int machine, Lane lane) {
  Expected next;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& queue = expected_[machine][lane];
    if (failed_ || queue.empty()) {
      reading_[machine][lane] = false;
      return;
    }
    // Copied, not popped: it stays first until it has arrived.
    next = queue.front();
  }
  mesh_.connection(machine, lane)
      .read(
          next.tag,
          next.target,
          [this, machine, lane, next](
              const std::string& error, std::string tag, size_t bytes) {
            if (stopped()) {
              return;
            }
            if (!error.empty()) {
              fail(
                  mesh_.peerRank(machine),
                  "receiving " + fromPeer(next, machine, lane) +
                      " failed: " + error);
              return;
            }
            if (tag != next.tag || bytes != next.target.bytes) {
              fail(
                  mesh_.peerRank(machine),
                  "receiving " + fromPeer(next, machine, lane) +
                      ": expected '" + next.tag + "' (" +
                      std::to_string(next.target.bytes) + " bytes) but got '" +
                      printable(tag, 120) + "' (" + std::to_string(bytes) +
                      " bytes); the ranks issued different all-reduces "
                      "(sizes, dtypes, ops or order differ)",
                  /*mismatch=*/true);
              return;
            }
            bytesReceived_ += static_cast<int64_t>(bytes);
            {
              std::lock_guard<std::mutex> lock(mutex_);
              if (failed_) {
                return;
              }
              expected_[machine][lane].pop_front();
            }
            next.onArrival();
            readNext(machine, lane);
          });
}

void Lanes::send(
    int machine,
    Lane lane,
    std::string tag,
    const Buffer& buffer,
    std::string what,
    std::function<void()> onSent) {
  checkPeer(machine);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) {
      return;
    }
  }
  const int peer = mesh_.peerRank(machine);
  const size_t bytes = buffer.bytes;
  mesh_.connection(machine, lane)
      .write(
          std::move(tag),
          buffer,
          [this,
           peer,
           lane,
           bytes,
           what = std::move(what),
           onSent = std::move(onSent)](const std::string& error) {
            if (stopped()) {
              return;
            }
            if (!error.empty()) {
              fail(
                  peer,
                  "sending " + what + " to rail peer rank " +
                      std::to_string(peer) + " (" + laneName(lane) +
                      ") failed: " + error);
              return;
            }
            bytesSent_ += static_cast<int64_t>(bytes);
            onSent();
          });
}

void Lanes::close(const std::string& reason) {
  fail(-1, reason);
}

void Lanes::fail(int peerRank, const std::string& message, bool mismatch) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::exchange(failed_, true)) {
      return;
    }
    for (auto& lanes : expected_) {
      for (auto& queue : lanes) {
        queue.clear();
      }
    }
  }
  mesh_.close();
  onFailure_(peerRank, mismatch, message);
}

} // namespace fairring::rails
