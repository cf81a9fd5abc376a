#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/tensorpipe/dial_handshakes.h"

#include <algorithm>
#include <set>

#include "rails/tensorpipe/handshake.h"

namespace fairring::rails {

DialHandshakes::DialHandshakes() : state_(std::make_shared<State>()) {}

size_t DialHandshakes::dial(
    const std::shared_ptr<tensorpipe::Pipe>& pipe,
    std::string hello,
    std::string key,
    int peer,
    const std::string& url) {
  size_t index = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    index = state_->dials.size();
    state_->dials.push_back({peer, url, false});
  }
  dialAuthenticated(
      pipe,
      std::move(hello),
      std::move(key),
      [state = state_, index](
          const std::string& why, const std::string& session) {
        std::lock_guard<std::mutex> lock(state->mutex);
        Dial& dial = state->dials[index];
        if (why.empty()) {
          dial.proven = true;
          dial.session = session;
        } else if (state->error.empty()) {
          state->error = "connecting to rank " + std::to_string(dial.peer) +
              " at " + dial.url + ": " + why;
        }
        state->changed.notify_all();
      });
  return index;
}

std::string DialHandshakes::session(size_t index) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->dials.at(index).session;
}

std::string DialHandshakes::wait(
    std::chrono::steady_clock::time_point deadline,
    const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  const auto settled = [&] {
    return !state_->error.empty() ||
        std::all_of(
            state_->dials.begin(), state_->dials.end(), [](const Dial& d) {
              return d.proven;
            });
  };
  while (!settled()) {
    const auto now = std::chrono::steady_clock::now();
    if (cancelled && cancelled()) {
      return "called off before every listener had proven itself";
    }
    if (now >= deadline) {
      std::set<int> waiting;
      for (const Dial& dial : state_->dials) {
        if (!dial.proven) {
          waiting.insert(dial.peer);
        }
      }
      std::string peers;
      for (const int peer : waiting) {
        peers += " " + std::to_string(peer);
      }
      return "the listener(s) of rank(s)" + peers +
          " did not answer this rank's hello with this group's proof in time";
    }
    state_->changed.wait_until(
        lock, std::min(deadline, now + std::chrono::milliseconds(50)));
  }
  return state_->error;
}

} // namespace fairring::rails
