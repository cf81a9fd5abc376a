#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <ATen/record_function.h>
#include <c10/core/Device.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include "engine/stage.h"
#include "topology.h"

namespace fairring {

// Where an op's stages show up: in the caller's torch.profiler trace and,
// with FAIRRING_TIMELINE, in a Chrome-trace file per rank and engine.

// The issuing thread's torch.profiler state. torch.profiler records only on
// threads that carry it, so the stage threads adopt the op's for each step
// (as autograd's threads do). Empty, and free, when no profiler was on.
class ProfilerContext {
 public:
  static ProfilerContext capture();

 private:
  friend class StageSpan;
  std::optional<at::RecordFunctionTLS> callbacks_;
  std::shared_ptr<c10::ThreadLocalDebugInfo> debugInfo_;
};

// One Chrome-trace file (JSON Array Format, which allows the closing bracket
// to be missing, so a killed process leaves a readable file):
// <directory>/fairring-<group>-rank<R>-<device>.json. Process id: the group
// rank; thread id: the stage. Timestamps are the system clock's, in
// microseconds, so files of ranks on one host line up.
class Timeline {
 public:
  using Clock = std::chrono::system_clock;

  // Throws, naming the path, if the file cannot be created.
  Timeline(
      const std::string& directory,
      const std::string& group,
      const Topology& topology,
      c10::Device device);
  ~Timeline();

  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Any thread. The all-gather stage flushes: its record ends a slice.
  void record(
      Stage stage,
      uint64_t op,
      int64_t slice,
      int64_t bytes,
      Clock::time_point start,
      Clock::time_point end);

  const std::string& path() const {
    return path_;
  }

 private:
  const int rank_;
  const std::string path_;
  std::mutex mutex_;
  std::ofstream out_; // guarded by mutex_
};

// One stage step of one slice, from construction to destruction: a
// "fairring:<stage>" range in the op's profiler (if any) and a Timeline
// event (if `timeline` is set). Lives on one stage thread.
class StageSpan {
 public:
  StageSpan(
      Timeline* timeline,
      const ProfilerContext& profiler,
      Stage stage,
      uint64_t op,
      int64_t slice,
      int64_t bytes);
  ~StageSpan();

  StageSpan(const StageSpan&) = delete;
  StageSpan& operator=(const StageSpan&) = delete;

 private:
  Timeline* const timeline_;
  const Stage stage_;
  const uint64_t op_;
  const int64_t slice_;
  const int64_t bytes_;
  const Timeline::Clock::time_point start_;
  // Restored on destruction, after the range below has ended.
  std::optional<at::RecordFunctionTLS> savedCallbacks_;
  std::optional<c10::DebugInfoGuard> debugInfo_;
  std::optional<at::RecordFunction> range_;
};

} // namespace fairring
