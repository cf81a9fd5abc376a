#include "rails/lanes.h"

#include <algorithm>

#include <c10/util/Exception.h>

#include "rails/peer_text.h"

namespace fairring::rails {

namespace {

constexpr std::string_view kAcked = "acked ";

const char* laneName(Lane lane) {
  return lane == kShards ? "shards lane" : "reduced lane";
}

} // namespace

std::string ackedNote(ReceivedCounts counts) {
  return std::string(kAcked) + std::to_string(counts.shards) + " " +
      std::to_string(counts.reduced);
}

std::optional<ReceivedCounts> parseAckedNote(std::string_view text) {
  if (!text.starts_with(kAcked)) {
    return std::nullopt;
  }
  text.remove_prefix(kAcked.size());
  const auto words = splitWords(text);
  if (words.size() != 2) {
    return std::nullopt;
  }
  const auto shards = parseCount<uint64_t>(words[0]);
  const auto reduced = parseCount<uint64_t>(words[1]);
  if (!shards || !reduced) {
    return std::nullopt;
  }
  return ReceivedCounts{*shards, *reduced};
}

// Marks a callback of `epoch` as run when it returns, whatever it did: a
// quiesce() waits for the stale ones.
class Lanes::CallbackDone {
 public:
  CallbackDone(Lanes& lanes, int machine, uint64_t epoch)
      : lanes_(lanes), machine_(machine), epoch_(epoch) {}
  CallbackDone(const CallbackDone&) = delete;
  CallbackDone& operator=(const CallbackDone&) = delete;
  ~CallbackDone() {
    std::lock_guard<std::mutex> lock(lanes_.mutex_);
    Peer& peer = lanes_.peers_[machine_];
    if (peer.epoch == epoch_) {
      --peer.pending;
    } else if (--peer.draining == 0) {
      lanes_.drained_.notify_all();
    }
  }

 private:
  Lanes& lanes_;
  const int machine_;
  const uint64_t epoch_;
};

Lanes::Lanes(Mesh& mesh, Failure onFailure, Broken onBroken)
    : mesh_(mesh),
      onFailure_(std::move(onFailure)),
      onBroken_(std::move(onBroken)),
      controlIndex_(mesh_.numMachines(), 0),
      peers_(mesh_.numMachines()) {
  const auto& neighbours = mesh_.neighbours();
  for (int machine = 0; machine < mesh_.numMachines(); ++machine) {
    if (machine != mesh_.machine()) {
      controlIndex_[machine] = static_cast<size_t>(
          std::find(
              neighbours.begin(), neighbours.end(), mesh_.peerRank(machine)) -
          neighbours.begin());
    }
  }
}

std::string Lanes::fromPeer(
    const Expected& expected, int machine, Lane lane) const {
  return expected.what + " from rail peer rank " +
      std::to_string(mesh_.peerRank(machine)) + " (" + laneName(lane) + ")";
}

bool Lanes::current(int machine, uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mutex_);
  return !failed_ && peers_[machine].epoch == epoch;
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
    Peer& peer = peers_[machine];
    peer.lanes[lane].expected.push_back(std::move(expected));
    idle = !peer.suspended && !std::exchange(peer.lanes[lane].reading, true);
  }
  // The transport may run callbacks inline: never call it under mutex_.
  if (idle) {
    readNext(machine, lane);
  }
}

void Lanes::readNext(int machine, Lane lane) {
  Expected next;
  uint64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Peer& peer = peers_[machine];
    Route& route = peer.lanes[lane];
    if (failed_ || peer.suspended || route.expected.empty()) {
      route.reading = false;
      return;
    }
    // Copied, not popped: it stays first until it has arrived.
    next = route.expected.front();
    epoch = peer.epoch;
    ++peer.pending;
  }
  mesh_.connection(machine, lane)
      .read(
          next.tag,
          next.target,
          [this, machine, lane, next, epoch](
              const std::string& error, std::string tag, size_t bytes) {
            const CallbackDone done(*this, machine, epoch);
            if (!current(machine, epoch)) {
              return; // stopped, or a connection since replaced: it resends
            }
            if (!error.empty()) {
              transportFailed(
                  machine,
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
              // Counted even if a switch began since: its quiesce() waits
              // for this callback before it reads the counts.
              std::lock_guard<std::mutex> lock(mutex_);
              if (failed_) {
                return;
              }
              Route& route = peers_[machine].lanes[lane];
              route.expected.pop_front();
              ++route.received;
            }
            next.onArrival();
            ack(machine);
            readNext(machine, lane);
          });
}

void Lanes::send(
    int machine,
    Lane lane,
    std::string tag,
    const Buffer& buffer,
    std::string what,
    std::function<void()> onSent,
    std::function<void()> onReleased) {
  checkPeer(machine);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) {
      return;
    }
    Route& route = peers_[machine].lanes[lane];
    route.unreleased.push_back(
        {route.nextNumber++,
         std::move(tag),
         buffer,
         std::move(what),
         std::move(onSent),
         std::move(onReleased)});
  }
  post(machine, lane);
}

void Lanes::post(int machine, Lane lane) {
  std::unique_lock<std::mutex> lock(mutex_);
  Peer& peer = peers_[machine];
  Route& route = peer.lanes[lane];
  if (std::exchange(route.posting, true)) {
    return; // the thread posting now posts this one too, in order
  }
  while (!failed_ && !peer.suspended && route.nextToPost < route.nextNumber) {
    const uint64_t number = route.nextToPost++;
    const auto found = std::find_if(
        route.unreleased.begin(),
        route.unreleased.end(),
        [number](const Outgoing& out) { return out.number == number; });
    if (found == route.unreleased.end()) {
      continue; // released already: the peer has it
    }
    const std::string tag = found->tag;
    const Buffer buffer = found->buffer;
    std::string what = found->what;
    const uint64_t epoch = peer.epoch;
    ++peer.pending;
    lock.unlock();
    const int peerRank = mesh_.peerRank(machine);
    mesh_.connection(machine, lane)
        .write(
            tag,
            buffer,
            [this,
             machine,
             lane,
             number,
             peerRank,
             bytes = buffer.bytes,
             epoch,
             what = std::move(what)](const std::string& error) {
              const CallbackDone done(*this, machine, epoch);
              if (!current(machine, epoch)) {
                return;
              }
              if (!error.empty()) {
                transportFailed(
                    machine,
                    "sending " + what + " to rail peer rank " +
                        std::to_string(peerRank) + " (" + laneName(lane) +
                        ") failed: " + error);
                return;
              }
              bytesSent_ += static_cast<int64_t>(bytes);
              std::vector<std::function<void()>> run;
              {
                std::lock_guard<std::mutex> lock(mutex_);
                auto& unreleased = peers_[machine].lanes[lane].unreleased;
                const auto found = std::find_if(
                    unreleased.begin(),
                    unreleased.end(),
                    [number](const Outgoing& out) {
                      return out.number == number;
                    });
                if (found != unreleased.end() && !found->sent) {
                  found->sent = true;
                  run.push_back(std::move(found->onSent));
                  if (!resends()) {
                    run.push_back(std::move(found->onReleased));
                    unreleased.erase(found);
                  }
                }
              }
              for (const auto& callback : run) {
                callback();
              }
            });
    lock.lock();
  }
  route.posting = false;
}

std::vector<std::function<void()>> Lanes::releaseLocked(
    int machine, Lane lane, uint64_t count) {
  std::vector<std::function<void()>> run;
  auto& unreleased = peers_[machine].lanes[lane].unreleased;
  while (!unreleased.empty() && unreleased.front().number < count) {
    Outgoing& out = unreleased.front();
    if (!out.sent) {
      run.push_back(std::move(out.onSent)); // all of it arrived
    }
    run.push_back(std::move(out.onReleased));
    unreleased.pop_front();
  }
  return run;
}

std::string Lanes::checkCountsLocked(
    int machine, ReceivedCounts counts, const char* how) {
  for (const Lane lane : {kShards, kReduced}) {
    const Route& route = peers_[machine].lanes[lane];
    const uint64_t released = route.unreleased.empty()
        ? route.nextNumber
        : route.unreleased.front().number;
    if (counts[lane] > route.nextNumber || counts[lane] < released) {
      return "rail peer rank " + std::to_string(mesh_.peerRank(machine)) + " " +
          how + " " + std::to_string(counts[lane]) + " messages on the " +
          laneName(lane) + ", but " + std::to_string(released) + " to " +
          std::to_string(route.nextNumber) + " were possible";
    }
  }
  return "";
}

void Lanes::acknowledged(int machine, ReceivedCounts counts) {
  checkPeer(machine);
  std::vector<std::function<void()>> run;
  std::string wrong;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) {
      return;
    }
    // A stale note (counts only grow) releases nothing; a count beyond what
    // was sent is a broken peer.
    const Route& shards = peers_[machine].lanes[kShards];
    const Route& reduced = peers_[machine].lanes[kReduced];
    if (counts.shards > shards.nextNumber ||
        counts.reduced > reduced.nextNumber) {
      wrong = checkCountsLocked(machine, counts, "acknowledged");
    } else {
      run = releaseLocked(machine, kShards, counts.shards);
      auto more = releaseLocked(machine, kReduced, counts.reduced);
      run.insert(
          run.end(),
          std::make_move_iterator(more.begin()),
          std::make_move_iterator(more.end()));
    }
  }
  if (!wrong.empty()) {
    fail(mesh_.peerRank(machine), wrong);
    return;
  }
  for (const auto& callback : run) {
    callback();
  }
}

void Lanes::ack(int machine) {
  if (!resends()) {
    return;
  }
  ReceivedCounts counts;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Peer& peer = peers_[machine];
    counts = {peer.lanes[kShards].received, peer.lanes[kReduced].received};
    if (failed_ || peer.suspended || peer.acking || counts == peer.ackedLast) {
      return;
    }
    peer.acking = true;
    peer.ackedLast = counts;
  }
  mesh_.control(controlIndex_[machine])
      .writeNote(ackedNote(counts), [this, machine](const std::string& error) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          peers_[machine].acking = false;
        }
        if (error.empty()) {
          ack(machine); // what arrived meanwhile
        }
      });
}

void Lanes::transportFailed(int machine, const std::string& message) {
  if (!resends()) {
    fail(mesh_.peerRank(machine), message);
    return;
  }
  suspend(machine);
  onBroken_(machine, message);
}

void Lanes::suspend(int machine) {
  checkPeer(machine);
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& peer = peers_[machine];
  ++peer.epoch;
  peer.suspended = true;
  peer.draining += std::exchange(peer.pending, 0);
  for (Route& route : peer.lanes) {
    route.reading = false; // its read is stale now; resume() reads again
  }
}

bool Lanes::quiesce(
    int machine,
    Clock::time_point deadline,
    const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mutex_);
  const Peer& peer = peers_[machine];
  while (peer.draining > 0 && !failed_ && !cancelled()) {
    const auto now = Clock::now();
    if (now >= deadline) {
      return false;
    }
    drained_.wait_until(
        lock, std::min(deadline, now + std::chrono::milliseconds(100)));
  }
  return peer.draining == 0 && !failed_;
}

ReceivedCounts Lanes::received(int machine) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Peer& peer = peers_[machine];
  return {peer.lanes[kShards].received, peer.lanes[kReduced].received};
}

void Lanes::resume(int machine, ReceivedCounts peerReceived) {
  checkPeer(machine);
  std::vector<std::function<void()>> run;
  std::string wrong;
  std::array<bool, kLanes> read{};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) {
      return;
    }
    wrong = checkCountsLocked(machine, peerReceived, "says it received");
    if (wrong.empty()) {
      Peer& peer = peers_[machine];
      peer.suspended = false;
      peer.acking = false;
      // The peer learnt what arrived here from the switch itself.
      peer.ackedLast = {
          peer.lanes[kShards].received, peer.lanes[kReduced].received};
      for (const Lane lane : {kShards, kReduced}) {
        Route& route = peer.lanes[lane];
        auto released = releaseLocked(machine, lane, peerReceived[lane]);
        run.insert(
            run.end(),
            std::make_move_iterator(released.begin()),
            std::make_move_iterator(released.end()));
        resent_ += static_cast<int64_t>(route.nextToPost - peerReceived[lane]);
        route.nextToPost = peerReceived[lane];
        read[lane] = !route.expected.empty() && !route.reading;
        route.reading = route.reading || read[lane];
      }
    }
  }
  if (!wrong.empty()) {
    fail(mesh_.peerRank(machine), wrong);
    return;
  }
  for (const auto& callback : run) {
    callback();
  }
  for (const Lane lane : {kShards, kReduced}) {
    post(machine, lane);
    if (read[lane]) {
      readNext(machine, lane);
    }
  }
  ack(machine);
}

void Lanes::close(const std::string& reason) {
  fail(-1, reason);
}

void Lanes::failPeer(int peerRank, const std::string& message) {
  fail(peerRank, message);
}

void Lanes::fail(int peerRank, const std::string& message, bool mismatch) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::exchange(failed_, true)) {
      return;
    }
    for (Peer& peer : peers_) {
      for (Route& route : peer.lanes) {
        route.expected.clear();
      }
    }
  }
  drained_.notify_all();
  mesh_.close();
  onFailure_(peerRank, mismatch, message);
}

} // namespace fairring::rails
