#include "rails/failover.h"

#include <algorithm>
#include <stdexcept>

#include "rails/interfaces.h"
#include "rails/peer_text.h"
#include "thread_name.h"

namespace fairring::rails {

namespace {

constexpr std::string_view kSwitch = "switch ";
constexpr size_t kWorkers = 8;
// How long an interface must stay up before the rails return to it.
constexpr auto kUpSettle = std::chrono::seconds(1);

bool interfaceUp(const std::string& name) {
  try {
    for (const auto& address : interfaceAddresses()) {
      if (address.name == name && address.up) {
        return true;
      }
    }
    return false;
  } catch (const std::exception&) {
    return true; // unknown: never a reason to switch
  }
}

std::string millisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::to_string(
             std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now() - start)
                 .count()) +
      " ms";
}

} // namespace

bool RailFailover::possible(const Mesh& mesh) {
  return !mesh.spareInterfaces().empty();
}

RailFailover::RailFailover(
    Mesh& mesh,
    Lanes& lanes,
    Watch& watch,
    const Topology& topology,
    Settings settings,
    Hooks hooks)
    : mesh_(mesh),
      lanes_(lanes),
      watch_(watch),
      topology_(topology),
      hooks_(std::move(hooks)),
      own_(mesh.interfaceName()),
      spares_(mesh.spareInterfaces()),
      settings_(settings),
      pairs_(topology.numMachines()) {
  for (Pair& pair : pairs_) {
    pair.interface = own_;
  }
  monitor_ = std::thread([this] {
    nameThisThread("fr-failover");
    monitor();
  });
  const size_t workers = std::min<size_t>(
      kWorkers, static_cast<size_t>(topology_.numMachines() - 1));
  for (size_t index = 0; index < workers; ++index) {
    workers_.emplace_back([this] {
      nameThisThread("fr-failover-wk");
      work();
    });
  }
}

RailFailover::~RailFailover() {
  shutdown();
}

void RailFailover::shutdown() {
  cancel();
  if (monitor_.joinable()) {
    monitor_.join();
  }
  for (auto& worker : workers_) {
    if (worker.joinable()) {
      worker.join();
    }
  }
}

void RailFailover::cancel() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
}

bool RailFailover::stopping() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopping_;
}

size_t RailFailover::controlIndex(int rank) const {
  const auto& neighbours = mesh_.neighbours();
  return static_cast<size_t>(
      std::find(neighbours.begin(), neighbours.end(), rank) -
      neighbours.begin());
}

std::string RailFailover::spareUp() const {
  for (const auto& spare : spares_) {
    if (interfaceUp(spare)) {
      return spare;
    }
  }
  return "";
}

std::vector<std::pair<int, std::string>> RailFailover::requestLocked(
    int machine, uint64_t generation, To to, bool relay) {
  Pair& pair = pairs_[machine];
  if (generation <= pair.generation || pair.stuck || stopping_) {
    return {};
  }
  pair.generation = generation;
  pair.to = to;
  pair.queued = true;
  pair.brokenAt.reset();
  pair.fail = nullptr;
  queue_.push_back(machine);
  wake_.notify_all();
  if (!relay) {
    return {};
  }
  const int peer = topology_.railPeers()[machine];
  // The rail peer has this rank's local index: its rail is the same.
  return {
      {peer,
       std::string(kSwitch) + std::to_string(topology_.rank()) + " " +
           std::to_string(peer) + " " + std::to_string(machine) + " " +
           std::to_string(topology_.localRank()) + " " +
           std::to_string(generation) + (to == To::kOwn ? " own" : " spare")}};
}

bool RailFailover::forward(
    int origin, int targetMachine, int targetRail, const std::string& text) {
  // Ranks know only their machine's ranks and their rail peers, so the note
  // names the target's place, not only its rank.
  const auto& local = topology_.localRanks();
  int next = -1;
  if (targetMachine == topology_.machine()) {
    next = local[targetRail];
  } else if (origin == topology_.rank()) {
    // Not through this rank's own rail: that is what is down. The next
    // rail's rank uses the first spare.
    next = local[(topology_.localRank() + 1) % local.size()];
  } else {
    next = topology_.railPeers()[targetMachine];
  }
  const size_t index = controlIndex(next);
  if (next == topology_.rank() || index >= mesh_.neighbours().size()) {
    return false;
  }
  mesh_.control(index).writeNote(text, [](const std::string&) {});
  return true;
}

void RailFailover::send(const std::vector<std::pair<int, std::string>>& notes) {
  for (const auto& [target, text] : notes) {
    forward(
        topology_.rank(),
        topology_.machineOf(target), // a rail peer: known here
        topology_.localRank(),
        text);
  }
}

bool RailFailover::onNote(int /*neighbour*/, const std::string& text) {
  std::string_view rest(text);
  if (!rest.starts_with(kSwitch)) {
    return false;
  }
  rest.remove_prefix(kSwitch.size());
  // "<origin> <target> <target's machine> <target's rail> <number> <to>"
  const auto words = splitWords(rest);
  if (words.size() != 6 || (words[5] != "own" && words[5] != "spare")) {
    return false;
  }
  const auto origin = parseCount<int>(words[0]);
  const auto target = parseCount<int>(words[1]);
  const auto machine = parseCount<int>(words[2]);
  const auto rail = parseCount<int>(words[3]);
  const auto generation = parseCount<uint64_t>(words[4]);
  const int world = topology_.worldSize();
  if (!origin || !target || !machine || !rail || !generation || *origin < 0 ||
      *origin >= world || *target < 0 || *target >= world || *machine < 0 ||
      *machine >= topology_.numMachines() || *rail < 0 ||
      *rail >= topology_.localSize()) {
    return false;
  }
  if (*target != topology_.rank()) {
    return forward(*origin, *machine, *rail, text);
  }
  // Only a rail peer switches with this rank.
  const auto& railPeers = topology_.railPeers();
  const auto found = std::find(railPeers.begin(), railPeers.end(), *origin);
  const int from = static_cast<int>(found - railPeers.begin());
  if (found == railPeers.end() || from == topology_.machine()) {
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  requestLocked(
      from,
      *generation,
      words[5] == "own" ? To::kOwn : To::kSpare,
      /*relay=*/false);
  return true;
}

void RailFailover::broken(int machine, std::function<void()> fail) {
  std::lock_guard<std::mutex> lock(mutex_);
  Pair& pair = pairs_[machine];
  if (pair.queued || pair.switching || pair.brokenAt) {
    return; // a switch explains it, or a break is already being weighed
  }
  pair.brokenAt = Clock::now();
  pair.fail = std::move(fail);
  wake_.notify_all();
}

void RailFailover::retime(Settings settings) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    settings_ = settings;
  }
  wake_.notify_all();
}

void RailFailover::monitor() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const Settings settings = settings_;
    lock.unlock();
    const bool ownUp = interfaceUp(own_);
    const auto silent = watch_.silences(settings.silenceLimit);
    lock.lock();
    if (stopping_) {
      break;
    }
    const auto now = Clock::now();
    std::vector<std::pair<int, std::string>> notes;
    const auto request = [&](int machine, To to, bool relay) {
      auto more =
          requestLocked(machine, pairs_[machine].generation + 1, to, relay);
      notes.insert(notes.end(), more.begin(), more.end());
    };
    const auto idle = [](const Pair& pair) {
      return !pair.queued && !pair.switching && !pair.stuck;
    };
    std::vector<std::function<void()>> failures;
    std::string warning;
    if (!ownUp) {
      ownUpSince_.reset();
      if (!std::exchange(ownDown_, true)) {
        std::string moved;
        for (int machine = 0; machine < topology_.numMachines(); ++machine) {
          Pair& pair = pairs_[machine];
          if (machine != topology_.machine() && pair.interface == own_ &&
              idle(pair)) {
            request(machine, To::kSpare, /*relay=*/true);
            pair.movedOff = true;
            moved += (moved.empty() ? "" : ", ") +
                std::to_string(topology_.railPeers()[machine]);
          }
        }
        const std::string spare = spareUp();
        warning = "interface " + own_ + " is down: rank " +
            std::to_string(topology_.rank()) +
            " moves its rails' connections to rank(s) " + moved + " to " +
            (spare.empty() ? "a spare interface (none is up)" : spare) +
            "; the ops in flight go on there";
      }
    } else if (ownDown_) {
      ownUpSince_ = ownUpSince_.value_or(now);
      if (now - *ownUpSince_ >= kUpSettle) {
        ownDown_ = false;
        for (int machine = 0; machine < topology_.numMachines(); ++machine) {
          Pair& pair = pairs_[machine];
          if (pair.movedOff && idle(pair)) {
            pair.movedOff = false;
            request(machine, To::kOwn, /*relay=*/true);
          }
        }
        lastEvent_ = "interface " + own_ + " came back";
      }
    }
    for (const auto& [rank, duration] : silent) {
      const int machine = topology_.machineOf(rank);
      if (machine != topology_.machine() &&
          topology_.railPeers()[machine] == rank && idle(pairs_[machine])) {
        request(machine, To::kSpare, /*relay=*/false);
      }
    }
    for (int machine = 0; machine < topology_.numMachines(); ++machine) {
      Pair& pair = pairs_[machine];
      if (!pair.brokenAt || !idle(pair)) {
        continue;
      }
      if (ownDown_) {
        request(machine, To::kSpare, /*relay=*/true);
      } else if (now - *pair.brokenAt >= settings.brokenGrace) {
        pair.brokenAt.reset();
        failures.push_back(std::move(pair.fail));
      }
    }
    lock.unlock();
    if (!warning.empty()) {
      hooks_.log(warning, /*warning=*/true);
    }
    send(notes);
    for (const auto& fail : failures) {
      fail();
    }
    lock.lock();
    wake_.wait_for(lock, settings.pollInterval, [this] { return stopping_; });
  }
}

void RailFailover::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) {
      return;
    }
    const int machine = queue_.front();
    queue_.pop_front();
    Pair& pair = pairs_[machine];
    if (!pair.queued) {
      continue; // queued twice; the first run took it
    }
    if (pair.switching) {
      queue_.push_back(machine); // after the one running
      wake_.wait_for(lock, std::chrono::milliseconds(10));
      continue;
    }
    pair.queued = false;
    pair.switching = true;
    const uint64_t generation = pair.generation;
    const To to = pair.to;
    lock.unlock();
    run(machine, generation, to);
    lock.lock();
  }
}

void RailFailover::run(int machine, uint64_t generation, To to) {
  const auto start = Clock::now();
  Clock::duration switchLimit;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    switchLimit = settings_.switchLimit;
  }
  const auto deadline = start + switchLimit;
  const auto cancelled = [this] { return stopping(); };
  const int peer = topology_.railPeers()[machine];
  const size_t control = controlIndex(peer);
  const std::string interface = to == To::kOwn ? own_ : spareUp();
  const std::string which = "rail switch " + std::to_string(generation) +
      " of rank " + std::to_string(topology_.rank()) + " with rank " +
      std::to_string(peer);
  lanes_.suspend(machine);
  watch_.suspend(control);
  mesh_.detach(machine);
  std::string error;
  const int64_t resentBefore = lanes_.resent();
  try {
    if (interface.empty()) {
      throw std::runtime_error("no spare interface is up");
    }
    if (!lanes_.quiesce(machine, deadline, cancelled)) {
      throw std::runtime_error("its old connections did not settle in time");
    }
    const ReceivedCounts peerReceived = mesh_.reconnect(
        machine,
        interface,
        generation,
        lanes_.received(machine),
        deadline,
        cancelled);
    lanes_.resume(machine, peerReceived);
    watch_.resume(control);
  } catch (const std::exception& caught) {
    error = caught.what();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Pair& pair = pairs_[machine];
    pair.switching = false;
    if (error.empty()) {
      pair.interface = interface;
      ++switches_;
      lastEvent_ = which + " to " + interface;
    } else {
      pair.stuck = true;
      lastEvent_ = which + " failed";
    }
  }
  if (!error.empty()) {
    if (!stopping()) {
      hooks_.log(
          which + " failed after " + millisecondsSince(start) + ": " + error +
              "; its ops wait until their timeout",
          /*warning=*/true);
    }
    return;
  }
  hooks_.log(
      which + ": its connections now go through " + interface + " (took " +
          millisecondsSince(start) + "; " +
          std::to_string(lanes_.resent() - resentBefore) +
          " message(s) sent again)",
      /*warning=*/false);
}

std::string RailFailover::describe() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string text = "failover to";
  for (const auto& spare : spares_) {
    text += " " + spare;
  }
  text += ": " + std::to_string(switches_) + " switch(es)";
  for (int machine = 0; machine < topology_.numMachines(); ++machine) {
    const Pair& pair = pairs_[machine];
    if (machine != topology_.machine() &&
        (pair.interface != own_ || pair.stuck)) {
      text += "; rank " + std::to_string(topology_.railPeers()[machine]) +
          (pair.stuck ? " stuck" : " through " + pair.interface);
    }
  }
  if (!lastEvent_.empty()) {
    text += "; last: " + lastEvent_;
  }
  return text;
}

} // namespace fairring::rails
