#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tensorpipe {
class Pipe;
} // namespace tensorpipe

namespace fairring::rails {

// The handshakes (handshake.h) a rank runs as the dialler while it builds its
// mesh or switches a rail, and the wait for all of them: a pipe is used only
// once its listener has proven it holds the group's rails key. Its state is
// shared with TensorPipe's callbacks, which may run after it is gone.
class DialHandshakes {
 public:
  DialHandshakes();

  // Starts the handshake of `pipe`, just connected to `peer` at `url`;
  // returns its index, for session().
  size_t dial(
      const std::shared_ptr<tensorpipe::Pipe>& pipe,
      std::string hello,
      std::string key,
      int peer,
      const std::string& url);

  // Waits until every handshake started has proven its listener, one
  // failed, `deadline` passed or `cancelled()`: empty if all proved, else
  // why not, naming the peer.
  std::string wait(
      std::chrono::steady_clock::time_point deadline,
      const std::function<bool()>& cancelled = {});
  // The session key of the handshake `index`, once wait() said all proved.
  std::string session(size_t index) const;

 private:
  struct Dial {
    int peer = -1;
    std::string url;
    bool proven = false;
    std::string session;
  };
  struct State {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<Dial> dials;
    std::string error; // the first failure
  };
  std::shared_ptr<State> state_;
};

} // namespace fairring::rails
