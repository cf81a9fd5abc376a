#include <torch_headers.h> // first: the precompiled torch headers

// The engine's failure handling: the causes it stops for, settling an
// uncertain cause against its neighbours' notices, the watchdog (heartbeats
// and op deadlines) and, for a timeout's error, whom each stuck slice waits
// for. The work path (engine/slices.cpp) only reports what it saw.

#include "engine/engine.h"

#include <optional>

#include <c10/util/Exception.h>

#include "engine/ops.h"

namespace fairring {

namespace {

std::string rankList(const std::vector<int>& ranks) {
  std::string list;
  for (int rank : ranks) {
    list += (list.empty() ? "" : ", ") + std::to_string(rank);
  }
  return list;
}

std::string secondsText(std::chrono::steady_clock::duration duration) {
  const auto tenths =
      std::chrono::duration_cast<std::chrono::milliseconds>(duration).count() /
      100;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " s";
}

} // namespace

std::string Engine::who(int rank) const {
  return topology_.describeRank(rank);
}

Engine::Cause Engine::stillNeeded(int rank, const std::string& detail) const {
  Cause cause = Cause::firstHand(
      who(rank) + " shut down its process group while " +
          who(topology_.rank()) + " still needed it; " + detail,
      rank);
  cause.kind = FailureKind::kRemote;
  return cause;
}

void Engine::leave(const std::string& did) {
  stop(
      Cause::leaving(
          topology_.rank(), who(topology_.rank()) + " " + did, /*drain=*/true));
}

void Engine::abort(const std::string& did) {
  stop(
      Cause::leaving(
          topology_.rank(),
          who(topology_.rank()) + " " + did,
          /*drain=*/false));
}

std::string Engine::localStepsState() const {
  switch (localStepsStopped_.load()) {
    case 1:
      return "closed";
    case 2:
      return "aborted";
    default:
      return "running";
  }
}

void Engine::fail(const std::string& what) {
  Cause cause = Cause::firstHand(what);
  cause.kind = FailureKind::kLocal; // the ranks disagree: no network's fault
  stop(std::move(cause));
}

bool Engine::departed(int rank) const {
  return std::find(departed_.begin(), departed_.end(), rank) != departed_.end();
}

void Engine::onBye(int neighbour) {
  std::optional<Cause> blamed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    departed_.push_back(neighbour);
    if (unsettled_ && unsettled_->culprit == neighbour) {
      blamed = unsettled_; // its connections closed before its goodbye came
    }
  }
  if (blamed) {
    stop(stillNeeded(neighbour, blamed->what));
  }
}

void Engine::onRailsFailure(
    int peerRank, bool mismatch, const std::string& message) {
  if (peerRank < 0) {
    return; // closed here, by stop()
  }
  const std::string me = who(topology_.rank());
  if (mismatch) {
    // Seen first hand, and no rank is more to blame than another.
    Cause cause = Cause::firstHand(me + ": " + message);
    cause.kind = FailureKind::kLocal;
    stop(std::move(cause));
    return;
  }
  bool gone = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    gone = departed(peerRank);
  }
  if (gone) {
    stop(stillNeeded(peerRank, message));
    return;
  }
  // The peer may have failed, or only stopped because of a failure elsewhere:
  // its notice, or its control connection breaking, tells which.
  stop(
      Cause::secondHand(
          me + " lost " + who(peerRank) + ": " + message, peerRank));
}

bool Engine::onRailsNote(int neighbour, const std::string& text) {
  const int machine = topology_.machineOf(neighbour);
  const bool railPeer = machine != topology_.machine() &&
      topology_.railPeers()[machine] == neighbour;
  if (const auto counts = rails::parseAckedNote(text)) {
    if (!railPeer || !lanes_->resends()) {
      return false;
    }
    lanes_->acknowledged(machine, *counts);
    return true;
  }
  if (failover_) {
    return failover_->onNote(neighbour, text);
  }
  // A rank without a spare takes no part in switches: a peer's attempt
  // times out, naming its interface.
  return text.starts_with("switch ");
}

void Engine::onNotice(int /*neighbour*/, const rails::Watch::Notice& notice) {
  Cause cause = Cause::firstHand(notice.what, notice.culprit);
  cause.kind = FailureKind::kRemote;
  stop(std::move(cause));
}

void Engine::onLost(int neighbour, const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (departed(neighbour)) {
      return; // it left in good order; an op that needs it will say so
    }
  }
  stop(
      Cause::firstHand(
          who(neighbour) +
              " exited, crashed or lost its network: its control connection "
              "to " +
              who(topology_.rank()) + " broke (" + error + ")",
          neighbour));
}

bool Engine::drainDevice() {
  Fence last;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last = lastReleased_;
  }
  const auto until = Clock::now() + kDrainLimit;
  return device_->waitOnHost(last, [until] { return Clock::now() > until; });
}

void Engine::stop(Cause cause) {
  std::deque<std::shared_ptr<Op>> ops;
  std::deque<ForeignLaunch> foreign;
  bool first = false;
  bool settled = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_.empty()) {
      return; // settled already
    }
    first = !failed_.exchange(true);
    const bool pending =
        std::any_of(liveOps_.begin(), liveOps_.end(), [](const auto& op) {
          return !op->settled;
        });
    cause.departure = cause.departure && !pending;
    if (!cause.certain) {
      if (!unsettled_) {
        // A cause that blames a peer waits for that peer's own word, which
        // may itself wait kSettleGrace.
        cause.settleBy = Clock::now() +
            (cause.culprit >= 0 ? 2 * kSettleGrace : kSettleGrace);
        unsettled_ = cause;
      }
    } else {
      unsettled_.reset();
      error_ = cause.what;
      settled = true;
      ops.swap(liveOps_);
      foreign.swap(foreign_);
    }
  }
  if (cause.departure) {
    watch_->farewell();
  } else if (cause.certain) {
    // Before the rails close: the neighbours read it before they see that.
    watch_->announce({cause.culprit, cause.what});
  }
  if (first) {
    if (failover_) {
      failover_->cancel();
    }
    progress_.notify_all();
    watchdogWake_.notify_all();
    staging_.interrupt();
    lanes_->close("stopped");
    // Launching ahead, a wait from now on waits for the op's failure on the
    // host; then the device waits for no more of the rails: it runs out what
    // it was given, and no caller's stream stays held behind it.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto* live : {&liveOps_, &ops}) { // ops: settled at once
        for (const auto& op : *live) {
          if (op->launchEnd) {
            op->launchEnd->stopped();
          }
        }
      }
    }
    device_->openSignals();
    // A departure leaves the local groups in good order: what runs on the
    // machine's other ranks finishes first (docs/design.md, "Leaving in good
    // order"). An abort, a failure, or a device that does not drain in
    // time: both groups are aborted at once.
    if (cause.departure && cause.drain && drainDevice()) {
      localSteps_->close();
      localStepsStopped_ = 1;
    } else {
      localSteps_->abort();
      localStepsStopped_ = 2;
    }
    device_->abort();
  }
  // Before any op's failure reaches its waiter, who may then exit: the
  // backend's abort hooks (the flight recorder's dump) run in onFailed.
  if (settled && !cause.departure && owner_.onFailed) {
    owner_.onFailed(cause.what, cause.kind);
  }
  const std::string prefix =
      "fairring: rank " + std::to_string(topology_.rank()) + ": ";
  for (const auto& op : ops) {
    op->fail(
        prefix + op->describe() + " failed: " + cause.what,
        cause.kind == FailureKind::kConnection ? ErrorClass::kNetwork
                                               : ErrorClass::kBackend);
  }
  for (const auto& launch : foreign) {
    launch.failed(prefix + "not launched: the engine stopped: " + cause.what);
  }
}

void Engine::watchdogLoop() {
  auto nextBeat = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const auto now = Clock::now();
    if (now >= nextBeat) {
      lock.unlock();
      watch_->heartbeat(owner_.status ? owner_.status() : std::string());
      lock.lock();
      nextBeat = now + heartbeatInterval_.load();
      continue;
    }
    auto wakeAt = nextBeat;
    if (unsettled_) {
      if (now >= unsettled_->settleBy) {
        Cause cause = *unsettled_;
        cause.certain = true;
        lock.unlock();
        stop(std::move(cause));
        lock.lock();
        continue;
      }
      wakeAt = std::min(wakeAt, unsettled_->settleBy);
    } else if (error_.empty()) {
      auto nextDeadline = Clock::time_point::max();
      if (auto cause = expiredLocked(now, nextDeadline)) {
        lock.unlock();
        stop(std::move(*cause));
        lock.lock();
        continue;
      }
      wakeAt = std::min(wakeAt, nextDeadline);
    }
    watchdogWake_.wait_until(lock, wakeAt);
  }
}

std::optional<Engine::Cause> Engine::expiredLocked(
    Clock::time_point now, Clock::time_point& nextDeadline) {
  std::shared_ptr<Op> expired;
  for (const auto& op : liveOps_) {
    if (op->settled) {
      continue;
    }
    if (op->deadline <= now) {
      expired = op; // ops are in issue order: the first expired is the oldest
      break;
    }
    nextDeadline = std::min(nextDeadline, op->deadline);
  }
  if (!expired) {
    return std::nullopt;
  }
  std::vector<int> awaited;
  const std::string where = whereStuckLocked(*expired, awaited);
  const std::string me = who(topology_.rank());
  std::string what = me + "'s " + expired->describe() + " timed out after " +
      std::to_string(expired->timeout.count()) + " ms, " + where;
  // An op's timeout, whomever it blames; but a NIC of this rank's that went
  // down is the network's failure.
  const auto timedOut = [](Cause cause) {
    cause.kind = FailureKind::kTimeout;
    return cause;
  };
  if (const std::string down = mesh_->downInterface(); !down.empty()) {
    Cause cause = Cause::firstHand(
        me + " lost its network: interface " + down + " is down; " + what,
        topology_.rank());
    cause.kind = FailureKind::kConnection;
    return cause;
  }
  for (int rank : awaited) {
    if (departed(rank)) {
      return timedOut(stillNeeded(rank, what));
    }
  }
  // A neighbour silent for several heartbeats is stopped, hung or cut off:
  // seen first hand, so certain. The one this op waits for comes first.
  const auto silences = watch_->silences(3 * heartbeatInterval_.load());
  if (silences.empty()) {
    return timedOut(Cause::secondHand(what));
  }
  auto culprit = silences.front();
  for (const auto& silence : silences) {
    if (std::find(awaited.begin(), awaited.end(), silence.first) !=
        awaited.end()) {
      culprit = silence;
      break;
    }
  }
  return timedOut(
      Cause::firstHand(
          who(culprit.first) + " stopped responding (" + me +
              " heard nothing from it for " + secondsText(culprit.second) +
              ": it is stopped, hung or unreachable); " + what,
          culprit.first));
}

std::string Engine::whereStuckLocked(
    const Op& op, std::vector<int>& awaited) const {
  // Its first unfinished slice, or, if that has not started, the oldest
  // started unfinished slice of all (it waits behind that).
  const auto firstUnfinished = [](const Op& op) -> std::shared_ptr<SliceWork> {
    for (const auto& weak : op.slices) {
      auto slice = weak.lock();
      if (slice && slice->step != SliceStep::kDone) {
        return slice;
      }
    }
    return nullptr;
  };
  auto slice = firstUnfinished(op);
  if (!slice) {
    return "while finishing";
  }
  std::string where = waitingForLocked(*slice, awaited);
  if (slice->step == SliceStep::kQueued) {
    for (const auto& other : liveOps_) {
      auto head = other->settled ? nullptr : firstUnfinished(*other);
      if (head && head->step != SliceStep::kQueued) {
        where = "behind " + head->op->describe() + ", " +
            waitingForLocked(*head, awaited);
        break;
      }
    }
  }
  return where;
}

std::vector<std::string> Engine::pending() const {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> lines;
  for (const auto& op : liveOps_) {
    if (op->settled) {
      continue;
    }
    std::vector<int> awaited;
    const std::string where = whereStuckLocked(*op, awaited);
    const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(
        now - (op->deadline - op->timeout));
    lines.push_back(
        who(topology_.rank()) + " " +
        c10::DeviceTypeName(device().type(), /*lower_case=*/true) + ": " +
        op->describe() + ", issued " + std::to_string(age.count()) +
        " ms ago (timeout " + std::to_string(op->timeout.count()) + " ms), " +
        where +
        (awaited.empty() ? "" : "; awaits rank(s) " + rankList(awaited)));
  }
  return lines;
}

std::string Engine::waitingForLocked(
    const SliceWork& slice, std::vector<int>& awaited) const {
  const std::string which = "slice " + std::to_string(slice.index + 1) +
      " of " + std::to_string(slice.op->slices.size());
  std::vector<int> localPeers;
  for (int rank : topology_.localRanks()) {
    if (rank != topology_.rank()) {
      localPeers.push_back(rank);
    }
  }
  const auto railPeersWhere = [&](const auto& missing) {
    std::vector<int> ranks;
    for (int machine = 0; machine < topology_.numMachines(); ++machine) {
      if (machine != topology_.machine() && missing(machine)) {
        ranks.push_back(topology_.railPeers()[machine]);
      }
    }
    return ranks;
  };
  switch (slice.step.load()) {
    case SliceStep::kQueued:
      return "queued (" + which + ")";
    case SliceStep::kStaging:
      return "waiting for staging memory that earlier slices hold (" + which +
          ")" +
          (lanes_->resends() ? "; with rail failover on, a slice holds it "
                               "until its rail peers acknowledge its sends"
                             : "");
    case SliceStep::kLocalReduceScatter:
      awaited = localPeers;
      return "in the local reduce-scatter of " + which + " with rank(s) " +
          rankList(localPeers) + " of its machine";
    case SliceStep::kAwaitShards:
      awaited = railPeersWhere([&](int m) { return !slice.shardFrom[m]; });
      return "waiting for the shards of " + which + " from rail peer rank(s) " +
          rankList(awaited);
    case SliceStep::kReducing:
      return "reducing " + which;
    case SliceStep::kAwaitReduced:
      awaited = railPeersWhere([&](int m) { return !slice.reducedFrom[m]; });
      if (!awaited.empty()) {
        return "waiting for the reduced shards of " + which +
            " from rail peer rank(s) " + rankList(awaited);
      }
      awaited = railPeersWhere([&](int m) { return slice.sendsTo[m] > 0; });
      if (!awaited.empty()) {
        return "waiting for its sends of " + which + " to rail peer rank(s) " +
            rankList(awaited) + " to complete";
      }
      // Only the launch order holds it: a later slice's reduce-scatter (or
      // an earlier op's step) goes first (launch_order.h).
      return "waiting for its turn to launch the local all-gather of " + which +
          " (a reduce-scatter the launch order puts first has not launched)";
    case SliceStep::kLocalAllGather:
      awaited = localPeers;
      return "in the local all-gather of " + which + " with rank(s) " +
          rankList(localPeers) + " of its machine";
    case SliceStep::kDone:
      break;
  }
  return "finishing " + which;
}

} // namespace fairring
