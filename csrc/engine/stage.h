#pragma once

#include "device/device.h"

namespace fairring {

// The stages of a slice that do device work, in the order a slice goes
// through them. Each has one thread and feeds one queue of the device.
enum class Stage : int { kReduceScatter = 0, kReduce = 1, kAllGather = 2 };
constexpr int kStages = 3;

constexpr const char* stageName(Stage stage) {
  switch (stage) {
    case Stage::kReduceScatter:
      return "reduce-scatter";
    case Stage::kReduce:
      return "reduce";
    case Stage::kAllGather:
      return "all-gather";
  }
  return "?";
}

// The device queue a stage's work goes on: the reduce-scatter reads the
// caller's input, the all-gather writes the result.
constexpr Queue queueOf(Stage stage) {
  switch (stage) {
    case Stage::kReduceScatter:
      return Queue::kInput;
    case Stage::kReduce:
      return Queue::kReduce;
    case Stage::kAllGather:
      return Queue::kOutput;
  }
  return Queue::kInput;
}

} // namespace fairring
