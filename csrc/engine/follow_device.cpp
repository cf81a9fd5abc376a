#include "engine/follow_device.h"

#include <chrono>
#include <utility>
#include <vector>

#include "device/capture.h"
#include "thread_name.h"

namespace fairring {

DeviceFollower::DeviceFollower(DeviceContext& device)
    : device_(device), thread_([this] {
        nameThisThread("fr-follower");
        // Its queries and launches touch no stream a caller captures
        // (Engine's stage threads do the same).
        if (device_.device().is_cuda()) {
          relaxCaptureChecksOnThisThread();
        }
        loop();
      }) {}

DeviceFollower::~DeviceFollower() {
  stop();
}

void DeviceFollower::post(
    Channel channel,
    Fence fence,
    std::function<void()> action,
    std::function<bool()> ready) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      return;
    }
    channels_[channel].push_back(
        Pending{std::move(fence), std::move(action), std::move(ready)});
  }
  posted_.notify_all();
}

void DeviceFollower::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (auto& channel : channels_) {
      channel.clear();
    }
  }
  posted_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void DeviceFollower::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    posted_.wait(lock, [&] {
      if (stopping_) {
        return true;
      }
      for (const auto& channel : channels_) {
        if (!channel.empty()) {
          return true;
        }
      }
      return false;
    });
    if (stopping_) {
      return;
    }
    // Each channel's front, as long as it is ready; fences and conditions
    // are checked without the lock, since both may take other locks.
    bool ran = false;
    for (auto& channel : channels_) {
      while (!channel.empty()) {
        Pending front = channel.front();
        lock.unlock();
        const bool ready =
            device_.fenceDone(front.fence) && (!front.ready || front.ready());
        if (ready) {
          front.action();
        }
        lock.lock();
        if (stopping_) {
          return; // stop() cleared the channels
        }
        if (!ready) {
          break;
        }
        channel.pop_front(); // only this thread pops, and stop() clears
        ran = true;
      }
    }
    if (!ran && !stopping_) {
      posted_.wait_for(lock, std::chrono::microseconds(20));
    }
  }
}

} // namespace fairring
