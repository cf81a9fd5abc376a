#include "engine/trace.h"

#include <cctype>
#include <filesystem>
#include <iomanip>

#include <c10/util/Exception.h>

namespace fairring {

namespace {

const char* profilerName(Stage stage) {
  switch (stage) {
    case Stage::kReduceScatter:
      return "fairring:reduce_scatter";
    case Stage::kReduce:
      return "fairring:reduce";
    case Stage::kAllGather:
      return "fairring:all_gather";
  }
  return "fairring:?";
}

// Group names are torch's (a number, or a hash for subgroups); keep the file
// name to characters that are safe everywhere.
std::string fileSafe(const std::string& name) {
  std::string safe;
  for (char c : name) {
    safe += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  }
  return safe.empty() ? "group" : safe;
}

double micros(Timeline::Clock::time_point time) {
  return std::chrono::duration<double, std::micro>(time.time_since_epoch())
      .count();
}

} // namespace

ProfilerContext ProfilerContext::capture() {
  ProfilerContext context;
  if (at::hasThreadLocalCallbacks()) {
    context.callbacks_ = at::get_record_function_tls_();
    context.debugInfo_ = c10::ThreadLocalDebugInfo::current();
  }
  return context;
}

Timeline::Timeline(
    const std::string& directory,
    const std::string& group,
    const Topology& topology,
    c10::Device device)
    : rank_(topology.rank()),
      path_((std::filesystem::path(directory) /
             ("fairring-" + fileSafe(group) + "-rank" +
              std::to_string(topology.rank()) + "-" + fileSafe(device.str()) +
              ".json"))
                .string()),
      out_(path_, std::ios::out | std::ios::trunc) {
  TORCH_CHECK(
      out_.good(),
      "fairring: cannot write the timeline file ",
      path_,
      " (FAIRRING_TIMELINE names the folder for it)");
  out_ << std::fixed << std::setprecision(1) << "[\n"
       << R"({"name":"process_name","ph":"M","pid":)" << rank_
       << R"(,"args":{"name":"rank )" << rank_ << " (machine "
       << topology.machine() << ", local rank " << topology.localRank() << ", "
       << device.str() << ")\"}},\n"
       << R"({"name":"process_sort_index","ph":"M","pid":)" << rank_
       << R"(,"args":{"sort_index":)" << rank_ << "}},\n";
  for (int stage = 0; stage < kStages; ++stage) {
    out_ << R"({"name":"thread_name","ph":"M","pid":)" << rank_ << R"(,"tid":)"
         << stage << R"(,"args":{"name":")"
         << stageName(static_cast<Stage>(stage)) << "\"}},\n";
  }
  out_.flush();
}

Timeline::~Timeline() {
  std::lock_guard<std::mutex> lock(mutex_);
  // The last event ends with a comma; an empty metadata event closes the
  // array validly.
  out_ << R"({"name":"trace_end","ph":"M","pid":)" << rank_ << "}\n]\n";
}

void Timeline::record(
    Stage stage,
    uint64_t op,
    int64_t slice,
    int64_t bytes,
    Clock::time_point start,
    Clock::time_point end) {
  std::lock_guard<std::mutex> lock(mutex_);
  out_ << R"({"name":")" << stageName(stage)
       << R"(","cat":"fairring","ph":"X","ts":)" << micros(start)
       << R"(,"dur":)" << micros(end) - micros(start) << R"(,"pid":)" << rank_
       << R"(,"tid":)" << static_cast<int>(stage) << R"(,"args":{"op":)" << op
       << R"(,"slice":)" << slice << R"(,"bytes":)" << bytes << "}},\n";
  if (stage == Stage::kAllGather) {
    out_.flush();
  }
}

StageSpan::StageSpan(
    Timeline* timeline,
    const ProfilerContext& profiler,
    Stage stage,
    uint64_t op,
    int64_t slice,
    int64_t bytes)
    : timeline_(timeline),
      stage_(stage),
      op_(op),
      slice_(slice),
      bytes_(bytes),
      start_(
          timeline ? Timeline::Clock::now() : Timeline::Clock::time_point()) {
  if (profiler.callbacks_) {
    savedCallbacks_ = at::get_record_function_tls_();
    at::set_record_function_tls_(*profiler.callbacks_);
    debugInfo_.emplace(profiler.debugInfo_);
  }
  range_.emplace(at::RecordScope::USER_SCOPE);
  if (range_->isActive()) {
    range_->before(profilerName(stage));
  } else {
    range_.reset();
  }
}

StageSpan::~StageSpan() {
  range_.reset();
  debugInfo_.reset();
  if (savedCallbacks_) {
    at::set_record_function_tls_(*savedCallbacks_);
  }
  if (timeline_ != nullptr) {
    timeline_->record(
        stage_, op_, slice_, bytes_, start_, Timeline::Clock::now());
  }
}

} // namespace fairring
