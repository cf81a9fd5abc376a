#pragma once

// What a group's all-reduces, reduce-scatters and all-gathers went through,
// by device type, kind and path (the engine or the delegate): how many, how
// many bytes, and for how long at least one was in flight. fairring.summary()
// (fairring/_summary.py) reads it, and the INFO line at shutdown says it.
//
// The funnel (Backend::issue) starts an op's interval just before its launch
// and counts it once launched: its interval runs from the launch to the end
// of its Work's future, on the host clock for CPU tensors; on the device for
// CUDA tensors, between an event recorded on the caller's stream at the call
// and one recorded where the future's callback runs (a stream that waits for
// the op's end). The busy time of a kind and path is the union of its ops'
// intervals, so that ops in flight together are not counted twice.
//
// What it costs an op: a lock, a clock read, a future callback; on CUDA two
// event records. benchmarks/summary_cost.py measures it.

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "backend/path_reason.h"
#include "engine/collective.h"

namespace fairring {

enum class UsagePath { kEngine, kDelegate };
constexpr size_t kUsagePaths = 2;
// Ops and bytes by size: bucket b holds the ops of 2^b to 2^(b+1) - 1 bytes.
constexpr size_t kSizeBuckets = 48;

struct UsageRow {
  c10::DeviceType deviceType = c10::kCPU;
  Collective kind = Collective::kAllReduce;
  UsagePath path = UsagePath::kEngine;
  int64_t ops = 0;
  int64_t bytes = 0; // of the N-chunk tensors (Engine::stats' bytesByKind)
  // The ops whose interval is in busySeconds: not those still in flight,
  // nor those that failed, ran in a coalescing block or were not timed.
  int64_t timedOps = 0;
  int64_t timedBytes = 0;
  double busySeconds = 0;
  std::array<int64_t, kSizeBuckets> opsBySize{};
  std::array<int64_t, kSizeBuckets> bytesBySize{};
  // Why they took this path (path_reason.h): on the delegate, what kept
  // each off the engine.
  std::array<int64_t, kPathReasons> opsByReason{};
};

class Usage {
 public:
  struct Interval; // one op's, shared with its Work's callback

  // An op's interval, started now (on CUDA: at this point of the current
  // stream); `timed` false: it will be counted, not timed.
  std::shared_ptr<Interval> start(c10::Device device, bool timed);
  // The op launched and counted as `kind` of `bytes` on `path`; its
  // interval ends with `work`'s future. An op whose Work has no future is
  // counted, not timed; one that did not launch is not counted at all.
  void count(
      const std::shared_ptr<Interval>& interval,
      Collective kind,
      UsagePath path,
      PathReason reason,
      int64_t bytes,
      const c10::intrusive_ptr<c10d::Work>& work);

  // Every kind and path that counted an op, with the intervals ended so far.
  std::vector<UsageRow> rows();

  // The rows' order: device type (CPU, CUDA), kind, path.
  static size_t indexOf(c10::DeviceType type, Collective kind, UsagePath path);

 private:
  struct Line {
    UsageRow row;
    // Counted and timed, in the order counted; harvested from the front
    // once ended.
    std::deque<std::shared_ptr<Interval>> open;
    double coveredUntil = 0; // seconds since epoch_ (host) or reference_
  };

  // Folds the ended intervals at the front of `line` into its busy time.
  void harvest(Line& line);
  double secondsOf(const Interval& interval, bool atEnd);

  std::mutex mutex_;
  std::array<Line, 2 * kCollectiveKinds * kUsagePaths> lines_;
  const std::chrono::steady_clock::time_point epoch_ =
      std::chrono::steady_clock::now();
  // CUDA intervals are measured from this event, recorded on the first
  // CUDA op's device; ops on another device are counted, not timed.
  std::shared_ptr<Interval> reference_;
};

} // namespace fairring
