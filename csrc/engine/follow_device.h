#pragma once

#include <array>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "device/device.h"

namespace fairring {

// The host's side of an engine that launches ahead (docs/design.md, "The
// host never waits"): actions that must wait for device work, taken off the
// stage threads so that no launch waits for the rails. An action runs once
// the fence it follows is done and its condition holds, after every action
// posted to its channel before it (a channel keeps the order the rails need:
// each lane's sends, and the receives, go in slice order); channels do not
// wait for each other.
//
// Threads: one of its own, which polls every 20 us while anything waits (as
// a stage thread polls a fence), made by the constructor and joined by
// stop() or the destructor; post() from any thread. Actions must not throw.
class DeviceFollower {
 public:
  enum Channel : int {
    kShardSends = 0, // a slice's shards, once copied out of staging
    kReducedSends, // its reduced shard, once copied out
    kReceives, // its receives, once the rails' memory is free
    kFinishes, // its completion, on the output queue
  };
  static constexpr int kChannels = 4;

  explicit DeviceFollower(DeviceContext& device);
  ~DeviceFollower();
  DeviceFollower(const DeviceFollower&) = delete;
  DeviceFollower& operator=(const DeviceFollower&) = delete;

  // `ready`: a host condition checked before `action` runs, on this thread
  // (null: none); it must not block.
  void post(
      Channel channel,
      Fence fence,
      std::function<void()> action,
      std::function<bool()> ready = nullptr);
  // Drops what waits and joins the thread; later posts are dropped.
  // Idempotent; not from an action.
  void stop();

 private:
  struct Pending {
    Fence fence;
    std::function<void()> action;
    std::function<bool()> ready;
  };
  void loop();

  DeviceContext& device_;
  std::mutex mutex_;
  std::condition_variable posted_;
  std::array<std::deque<Pending>, kChannels> channels_;
  bool stopping_ = false;
  std::thread thread_; // last: it uses the members above
};

} // namespace fairring
