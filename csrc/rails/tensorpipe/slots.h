#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "rails/tensorpipe/acceptor.h"
#include "rails/tensorpipe/connection.h"

namespace fairring::rails {

// The TensorPipe mesh's connections: by a rail peer's machine, its data
// lanes; by neighbour (rail peers and this machine's other ranks), a control
// connection. What happens to them, per rail peer:
//
//   kOpen --kDetach--> kDetached --kInstall--> kOpen      (a rail switch)
//
// and to the whole mesh, kCloseData: every data connection closed for good,
// the control ones left open so that a failure notice sent just before still
// arrives.
//
// Every transition is in apply(), under the lock. The connections a
// transition closes are closed after the lock is released: TensorPipe may
// run their callbacks, which come back for the slots, on the closing thread.
// A replaced connection stays allocated until the slots go, because
// callbacks still due refer to it.
class ConnectionSlots {
 public:
  enum class PeerState { kOpen, kDetached };
  enum class Event { kDetach, kInstall, kCloseData };
  using Made = std::vector<std::unique_ptr<TensorpipeConnection>>;

  ConnectionSlots(int machines, size_t neighbours)
      : data_(machines),
        states_(machines, PeerState::kOpen),
        controls_(neighbours) {}

  // While the mesh is built, before any other thread sees it.
  void place(
      int machine,
      size_t neighbour,
      int lane,
      std::unique_ptr<TensorpipeConnection> connection) {
    if (lane == kControlLane) {
      controls_.at(neighbour) = std::move(connection);
    } else {
      data_.at(machine).at(lane) = std::move(connection);
    }
  }

  Connection& data(int machine, Lane lane) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto& connection = data_.at(machine)[lane];
    TORCH_CHECK(
        connection, "fairring: no rail connection to machine ", machine);
    return *connection;
  }

  Connection& control(size_t neighbour) const {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(
        neighbour < controls_.size() && controls_[neighbour],
        "fairring: no control connection to neighbour ",
        neighbour);
    return *controls_[neighbour];
  }

  // `machine`'s rail peer, whose control connection is `neighbour`'s (both
  // ignored by kCloseData); for kInstall, `made` holds its new connections
  // by lane, the control one last.
  void apply(Event event, int machine, size_t neighbour, Made made = {}) {
    std::vector<TensorpipeConnection*> closing;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      switch (event) {
        case Event::kCloseData:
          for (const auto& lanes : data_) {
            for (const auto& connection : lanes) {
              closing.push_back(connection.get());
            }
          }
          break;
        case Event::kDetach:
          for (const auto& connection : data_.at(machine)) {
            closing.push_back(connection.get());
          }
          closing.push_back(controls_.at(neighbour).get());
          states_.at(machine) = PeerState::kDetached;
          break;
        case Event::kInstall:
          TORCH_CHECK(
              states_.at(machine) == PeerState::kDetached &&
                  made.size() == static_cast<size_t>(kLanes) + 1,
              "fairring: a rail switch installs ",
              kLanes + 1,
              " connections to a detached rail peer");
          for (int lane = 0; lane < kLanes; ++lane) {
            replaced_.push_back(
                std::exchange(data_[machine][lane], std::move(made[lane])));
          }
          replaced_.push_back(
              std::exchange(
                  controls_.at(neighbour), std::move(made[kControlLane])));
          states_[machine] = PeerState::kOpen;
          break;
      }
    }
    for (TensorpipeConnection* connection : closing) {
      if (connection != nullptr) {
        connection->close();
      }
    }
  }

 private:
  mutable std::mutex mutex_; // brief: guards the members below
  // By machine; empty for this rank's own machine.
  std::vector<std::array<std::unique_ptr<TensorpipeConnection>, kLanes>> data_;
  std::vector<PeerState> states_; // by machine
  std::vector<std::unique_ptr<TensorpipeConnection>> controls_; // by neighbour
  std::vector<std::unique_ptr<TensorpipeConnection>> replaced_;
};

} // namespace fairring::rails
