#include "rails/watch.h"

namespace fairring::rails {

namespace {
constexpr std::string_view kAlive = "alive";
constexpr std::string_view kBye = "bye";
constexpr std::string_view kFailed = "failed ";
} // namespace

Watch::Watch(Mesh& mesh, int worldSize, Handlers handlers)
    : mesh_(mesh),
      worldSize_(worldSize),
      handlers_(std::move(handlers)),
      lastHeard_(mesh.neighbours().size(), Clock::now()),
      epochs_(mesh.neighbours().size(), 0) {}

void Watch::start() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::fill(lastHeard_.begin(), lastHeard_.end(), Clock::now());
  }
  for (size_t index = 0; index < lastHeard_.size(); ++index) {
    readNext(index, 0);
  }
}

void Watch::suspend(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++epochs_.at(index);
}

void Watch::resume(size_t index) {
  uint64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lastHeard_.at(index) = Clock::now();
    epoch = epochs_[index];
  }
  readNext(index, epoch);
}

bool Watch::current(size_t index, uint64_t epoch) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return epochs_[index] == epoch;
}

void Watch::readNext(size_t index, uint64_t epoch) {
  const int neighbour = mesh_.neighbours()[index];
  mesh_.control(index).readNote([this, index, neighbour, epoch](
                                    const std::string& error,
                                    std::string text) {
    if (!current(index, epoch)) {
      return; // a connection a rail switch replaced
    }
    if (!error.empty()) {
      handlers_.onLost(neighbour, error);
      return; // no more reads: the connection is gone
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      lastHeard_[index] = Clock::now();
    }
    if (text == kBye) {
      handlers_.onBye(neighbour);
    } else if (text.starts_with(kAlive)) {
      std::string_view status(text);
      status.remove_prefix(kAlive.size());
      if (!status.empty() && !status.starts_with(' ')) {
        handlers_.onLost(
            neighbour,
            "it sent a malformed control note '" + text.substr(0, 80) + "'");
        return;
      }
      if (!status.empty() && handlers_.onStatus) {
        handlers_.onStatus(neighbour, status.substr(1));
      }
    } else if (text.starts_with(kFailed)) {
      Notice notice;
      if (!parseNotice(text, worldSize_, notice)) {
        handlers_.onLost(
            neighbour,
            "it sent a malformed control note '" + printable(text, 80) + "'");
        return;
      }
      handlers_.onNotice(neighbour, notice);
    } else if (
        !handlers_.onRailsNote || !handlers_.onRailsNote(neighbour, text)) {
      handlers_.onLost(
          neighbour,
          "it sent a malformed control note '" + printable(text, 80) + "'");
      return;
    }
    readNext(index, epoch);
  });
}

void Watch::heartbeat(const std::string& status) {
  std::string text(kAlive);
  if (!status.empty() && kAlive.size() + 1 + status.size() <= kMaxNoteBytes) {
    text += " " + status; // cut short, it would mislead: then none at all
  }
  for (size_t index = 0; index < lastHeard_.size(); ++index) {
    // A failed write shows on the read side as a lost connection.
    mesh_.control(index).writeNote(text, [](const std::string&) {});
  }
}

void Watch::announce(const Notice& notice) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::exchange(announced_, true)) {
      return;
    }
  }
  std::string text =
      std::string(kFailed) + std::to_string(notice.culprit) + " " + notice.what;
  if (text.size() > kMaxNoteBytes) {
    text.resize(kMaxNoteBytes);
  }
  for (size_t index = 0; index < lastHeard_.size(); ++index) {
    mesh_.control(index).writeNote(text, [](const std::string&) {});
  }
}

void Watch::farewell() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::exchange(announced_, true)) {
      return;
    }
  }
  for (size_t index = 0; index < lastHeard_.size(); ++index) {
    mesh_.control(index).writeNote(
        std::string(kBye), [](const std::string&) {});
  }
}

std::vector<std::pair<int, Watch::Clock::duration>> Watch::silences(
    Clock::duration atLeast) const {
  std::vector<std::pair<int, Clock::duration>> silent;
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t index = 0; index < lastHeard_.size(); ++index) {
    if (now - lastHeard_[index] >= atLeast) {
      silent.emplace_back(mesh_.neighbours()[index], now - lastHeard_[index]);
    }
  }
  return silent;
}

bool Watch::parseNotice(
    const std::string& text, int worldSize, Notice& notice) {
  std::string_view rest(text);
  if (!rest.starts_with(kFailed)) {
    return false;
  }
  rest.remove_prefix(kFailed.size());
  const auto culprit = takeWord(rest);
  const auto rank = culprit ? parseDecimal<int>(*culprit) : std::nullopt;
  if (!rank || *rank < -1 || *rank >= worldSize) {
    return false;
  }
  notice.culprit = *rank;
  // Quoted in every rank's errors: it came from a peer.
  notice.what = printable(rest, kMaxNoteBytes);
  return true;
}

} // namespace fairring::rails
