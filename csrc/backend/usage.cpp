#include "backend/usage.h"

#include <atomic>
#include <bit>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace fairring {

namespace {

// Counted and never ended (a hung op): beyond this many behind it, the
// oldest is dropped untimed, so that a stuck op cannot hold the rest for ever.
constexpr size_t kMostOpen = 4096;

size_t sizeBucket(int64_t bytes) {
  if (bytes <= 0) {
    return 0;
  }
  const auto bucket =
      static_cast<size_t>(std::bit_width(static_cast<uint64_t>(bytes)) - 1);
  return std::min(bucket, kSizeBuckets - 1);
}

c10::Stream currentStream(c10::Device device) {
  const c10::impl::VirtualGuardImpl impl(device.type());
  return impl.getStream(device);
}

} // namespace

struct Usage::Interval {
  enum State { kOpen, kEnded, kUntimed };

  explicit Interval(c10::Device on) : device(on) {}

  c10::Device device;
  int64_t bytes = 0;
  bool timed = false;
  std::chrono::steady_clock::time_point started;
  std::chrono::steady_clock::time_point finished; // written before kEnded
  std::optional<c10::Event> startEvent; // CUDA
  std::optional<c10::Event> endEvent; // CUDA, recorded before kEnded
  std::atomic<int> state{kOpen};

  // Called once, where its Work's future completes; never throws.
  void finish(c10::ivalue::Future& done) noexcept {
    if (done.hasError()) {
      state.store(kUntimed, std::memory_order_release);
      return;
    }
    try {
      if (startEvent) {
        // The callback's current stream waits for the future's events.
        endEvent.emplace(device.type(), c10::EventFlag::BACKEND_DEFAULT);
        endEvent->record(currentStream(device));
      } else {
        finished = std::chrono::steady_clock::now();
      }
      state.store(kEnded, std::memory_order_release);
    } catch (...) {
      state.store(kUntimed, std::memory_order_release);
    }
  }

  bool onDevice() const {
    return startEvent.has_value();
  }
};

size_t Usage::indexOf(c10::DeviceType type, Collective kind, UsagePath path) {
  const size_t device = type == c10::kCPU ? 0 : 1;
  return (device * kCollectiveKinds + static_cast<size_t>(kind)) * kUsagePaths +
      static_cast<size_t>(path);
}

std::shared_ptr<Usage::Interval> Usage::start(c10::Device device, bool timed) {
  auto interval = std::make_shared<Interval>(device);
  if (timed && device.is_cuda()) {
    try {
      interval->startEvent.emplace(
          device.type(), c10::EventFlag::BACKEND_DEFAULT);
      interval->startEvent->record(currentStream(device));
      std::lock_guard<std::mutex> lock(mutex_);
      if (reference_ == nullptr) {
        reference_ = interval; // its start event is the reference
      } else if (reference_->device != device) {
        timed = false;
      }
    } catch (const std::exception&) {
      timed = false;
    }
  }
  interval->timed = timed;
  interval->started = std::chrono::steady_clock::now();
  return interval;
}

void Usage::count(
    const std::shared_ptr<Interval>& interval,
    Collective kind,
    UsagePath path,
    PathReason reason,
    int64_t bytes,
    const c10::intrusive_ptr<c10d::Work>& work) {
  interval->bytes = bytes;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  if (interval->timed && work) {
    try {
      future = work->getFuture();
    } catch (const std::exception&) {
      future = nullptr; // a Work without a future: counted, not timed
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Line& line = lines_[indexOf(interval->device.type(), kind, path)];
    UsageRow& row = line.row;
    row.deviceType = interval->device.type();
    row.kind = kind;
    row.path = path;
    ++row.ops;
    ++row.opsByReason[static_cast<size_t>(reason)];
    row.bytes += bytes;
    ++row.opsBySize[sizeBucket(bytes)];
    row.bytesBySize[sizeBucket(bytes)] += bytes;
    if (future) {
      line.open.push_back(interval);
      if (line.open.size() > kMostOpen) {
        line.open.pop_front();
      }
    }
    harvest(line);
  }
  if (future) {
    // Holds the interval, not this object: a Work may outlive its group.
    // It may run at once, where the future has completed.
    future->addCallback(
        [interval](c10::ivalue::Future& done) { interval->finish(done); });
  }
}

double Usage::secondsOf(const Interval& interval, bool atEnd) {
  if (interval.onDevice()) {
    const c10::Event& event = atEnd ? *interval.endEvent : *interval.startEvent;
    return reference_->startEvent->elapsedTime(event) / 1e3;
  }
  return std::chrono::duration<double>(
             (atEnd ? interval.finished : interval.started) - epoch_)
      .count();
}

void Usage::harvest(Line& line) {
  while (!line.open.empty()) {
    Interval& interval = *line.open.front();
    const int state = interval.state.load(std::memory_order_acquire);
    if (state == Interval::kOpen) {
      return;
    }
    if (state == Interval::kEnded) {
      double start = 0;
      double finish = 0;
      try {
        if (interval.onDevice() &&
            !(interval.endEvent->query() && reference_->startEvent->query())) {
          return; // the device has not got there yet
        }
        start = secondsOf(interval, false);
        finish = secondsOf(interval, true);
      } catch (const std::exception&) {
        line.open.pop_front(); // not timed after all
        continue;
      }
      UsageRow& row = line.row;
      ++row.timedOps;
      row.timedBytes += interval.bytes;
      // Intervals come about in the order they began: the union grows at
      // its end.
      if (finish > line.coveredUntil) {
        row.busySeconds += finish - std::max(start, line.coveredUntil);
        line.coveredUntil = finish;
      }
    }
    line.open.pop_front();
  }
}

std::vector<UsageRow> Usage::rows() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<UsageRow> counted;
  for (Line& line : lines_) {
    if (line.row.ops > 0) {
      harvest(line);
      counted.push_back(line.row);
    }
  }
  return counted;
}

} // namespace fairring
