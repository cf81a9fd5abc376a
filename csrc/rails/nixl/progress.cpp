#include <torch_headers.h> // first: the precompiled torch headers

// The NIXL mesh's thread (progressLoop): it hands queued grants, notes and
// writes to NIXL, polls the transfers it posted and the notifications that
// arrived, routes each notification to its link (onNotification), and lets
// held-back writes go once due. Every callback it collects runs after the
// mesh's lock is released.

#include "rails/nixl/mesh.h"

#include <c10/util/Exception.h>

#include "rails/peer_text.h"

namespace fairring::rails::nixl {

namespace {

// How long the mesh's thread sleeps between polls: while it waits for peers,
// and while it has nothing to wait for (control notes only).
constexpr auto kBusyPoll = std::chrono::microseconds(20);
constexpr auto kIdlePoll = std::chrono::milliseconds(1);

} // namespace

void NixlMesh::onNotification(
    const std::string& agent,
    const std::string& bytes,
    std::vector<Callback>& later) {
  const auto found = byAgent_.find(agent);
  if (found == byAgent_.end()) {
    ++refused_;
    if (firstRefusal_.empty()) {
      firstRefusal_ = "a notification from agent '" + printable(agent, 64) +
          "', no neighbour";
    }
    return;
  }
  const size_t neighbour = found->second;
  std::string error;
  const auto message = parse(bytes, kLanes, kMaxNoteBytes, error);
  if (!message) {
    misbehavedLocked(neighbour, error, later);
    return;
  }
  if (message->kind == Kind::kNote) {
    error =
        controlLinks_[neighbour].arrived(message->seq, message->text, later);
  } else if (!isRailPeer(neighbour)) {
    error = "data traffic on a control connection";
  } else if (message->kind == Kind::kClosed) {
    const int machine = machineOfNeighbour(neighbour);
    for (int lane = 0; lane < kLanes; ++lane) {
      closeLinkLocked(
          machine,
          static_cast<Lane>(lane),
          describePeer(neighbour) + " closed its rails (" +
              printable(message->text, 200) + ")",
          later);
    }
  } else {
    const int machine = machineOfNeighbour(neighbour);
    const Lane lane = static_cast<Lane>(message->lane);
    DataLink& link = linkLocked(machine, lane);
    if (message->kind == Kind::kGrant) {
      LinkEffects effects;
      if (!link.closed().empty()) {
        // In flight when the link closed.
      } else if (!peers_[neighbour].holds(message->address, message->bytes)) {
        error = "it granted memory outside its staging";
      } else {
        error = link.granted(*message, effects);
      }
      applyLocked(machine, lane, effects, later);
    } else {
      // Data or header: the end of the read pending on this link.
      Callback arrival;
      error = link.ended(*message, arrival);
      if (arrival) {
        arrivedLocked(std::move(arrival), later);
      }
    }
  }
  if (!error.empty()) {
    misbehavedLocked(neighbour, error, later);
  }
}

bool NixlMesh::waitingForPeersLocked() const {
  if (!transfers_.empty() || !waiting_.empty() || !heldBack_.empty()) {
    return true;
  }
  for (const auto& link : links_) {
    if (link.waiting()) {
      return true;
    }
  }
  return false;
}

void NixlMesh::progressLoop() {
  while (true) {
    bool busy = sendOutgoing();
    busy = pollTransfers() || busy;
    busy = pollNotifications() || busy;
    busy = releaseHeldBack() || busy;
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) {
      // What was queued before (farewells, close notices) still goes out.
      lock.unlock();
      sendOutgoing();
      break;
    }
    if (!busy && outbox_.empty()) {
      const std::chrono::microseconds poll =
          waitingForPeersLocked() ? kBusyPoll : kIdlePoll;
      wake_.wait_for(lock, poll);
    }
  }
}

bool NixlMesh::sendOutgoing() {
  std::deque<Outgoing> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    work.swap(outbox_);
  }
  const bool did = !work.empty();
  const size_t waited = waiting_.size();
  for (size_t index = 0; index < waited; ++index) {
    work.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  for (auto& outgoing : work) {
    if (auto* notify = std::get_if<Notify>(&outgoing)) {
      std::string error;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        error = controlLinks_[notify->neighbour].broken();
      }
      if (error.empty()) {
        const int status =
            agent_->notify(peers_[notify->neighbour].agent, notify->bytes);
        if (status != kSuccess) {
          // A peer that exited or cannot be reached: its connections fail
          // now, so the Watch names it without waiting for its silence.
          error = "NIXL could not reach " + describePeer(notify->neighbour) +
              ": " + statusText(status);
          std::vector<Callback> later;
          {
            std::lock_guard<std::mutex> lock(mutex_);
            lostLocked(notify->neighbour, error, later);
          }
          runAll(later);
        }
      }
      if (notify->done) {
        notify->done(error);
      }
    } else {
      auto& post = std::get<Post>(outgoing);
      if (post.start.write.ready && !post.start.write.ready->query()) {
        waiting_.push_back(std::move(post));
      } else {
        startTransfer(std::move(post));
      }
    }
  }
  return did;
}

void NixlMesh::startTransfer(Post post) {
  const size_t neighbour = neighbourOfMachine(post.machine);
  const Peer& peer = peers_[neighbour];
  Write& write = post.start.write;
  const Message landed{
      Kind::kData, post.lane, post.start.seq, 0, write.buffer.bytes, write.tag};
  const std::string notice = encode(landed);
  if (write.buffer.bytes == 0) {
    const int status = agent_->notify(peer.agent, notice);
    write.done(
        status == kSuccess ? ""
                           : "NIXL could not notify " +
                describePeer(neighbour) + ": " + statusText(status));
    return;
  }
  const Grant& grant = post.start.grant;
  InFlight posted;
  const int status = agent_->write(
      write.buffer,
      Agent::Target{&peer.agent, grant.address, grant.bytes, peer.deviceId},
      notice,
      post.start.silent,
      posted.transfer);
  if (status == kInProgress) {
    posted.done = std::move(write.done);
    transfers_.push_back(std::move(posted));
    return;
  }
  write.done(
      status == kSuccess ? ""
                         : "NIXL (" + backendName_ + ") could not write " +
              std::to_string(write.buffer.bytes) + " bytes to " +
              describePeer(neighbour) + ": " + statusText(status) +
              "; check the network between them and UCX_TLS / UCX_NET_DEVICES");
}

bool NixlMesh::pollTransfers() {
  bool did = false;
  for (size_t index = 0; index < transfers_.size();) {
    const int status = agent_->status(transfers_[index].transfer);
    if (status == kInProgress) {
      ++index;
      continue;
    }
    did = true;
    InFlight finished = std::move(transfers_[index]);
    transfers_.erase(transfers_.begin() + static_cast<std::ptrdiff_t>(index));
    finished.transfer = {}; // released before its completion runs
    finished.done(
        status == kSuccess ? "" : "a NIXL write failed: " + statusText(status));
  }
  return did;
}

bool NixlMesh::pollNotifications() {
  const auto received = agent_->notifications();
  std::vector<Callback> later;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [agent, bytes] : received) {
      onNotification(agent, bytes, later);
    }
  }
  runAll(later);
  return !received.empty();
}

bool NixlMesh::releaseHeldBack() {
  std::vector<Callback> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    while (!heldBack_.empty() && heldBack_.front().first <= now) {
      due.push_back(std::move(heldBack_.front().second));
      heldBack_.pop_front();
    }
  }
  runAll(due);
  return !due.empty();
}

} // namespace fairring::rails::nixl
