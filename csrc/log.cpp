#include "log.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string_view>

#include <c10/util/Logging.h>

namespace fairring {

namespace {

constexpr int kUnset = -1;
std::atomic<int> threshold{kUnset};
std::atomic<int> processRank{-1};

const char* levelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?";
}

// As fairring._log's formatter writes the Python side's lines.
std::string linePrefix(LogLevel level) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(
                          now.time_since_epoch())
                          .count() %
      1000;
  std::tm local{};
  ::localtime_r(&seconds, &local);
  std::array<char, 32> stamp{};
  std::strftime(stamp.data(), stamp.size(), "%Y-%m-%d %H:%M:%S", &local);
  std::array<char, 256> host{};
  ::gethostname(host.data(), host.size() - 1);
  const int rank = processRank.load();
  std::array<char, 512> prefix{};
  std::snprintf(
      prefix.data(),
      prefix.size(),
      "%s.%03d %s:%d [rank %s] fairring %s: ",
      stamp.data(),
      static_cast<int>(millis),
      host.data(),
      static_cast<int>(::getpid()),
      rank < 0 ? "?" : std::to_string(rank).c_str(),
      levelName(level));
  return prefix.data();
}

} // namespace

void setLogLevel(std::optional<LogLevel> level, int rank) {
  processRank = rank;
  threshold = level ? static_cast<int>(*level) : kUnset;
}

void notice(LogLevel level, const std::string& text) {
  const int set = threshold.load();
  if (set == kUnset) {
    switch (level) {
      case LogLevel::kDebug:
        VLOG(1) << text;
        return;
      case LogLevel::kInfo:
        LOG(INFO) << text;
        return;
      case LogLevel::kWarning:
        LOG(WARNING) << text;
        return;
      case LogLevel::kError:
        LOG(ERROR) << text;
        return;
    }
  }
  if (static_cast<int>(level) < set) {
    return;
  }
  // The prefix names fairring already; c10's lines need the text to.
  constexpr std::string_view kOwnName = "fairring: ";
  const std::string_view body = std::string_view(text).starts_with(kOwnName)
      ? std::string_view(text).substr(kOwnName.size())
      : std::string_view(text);
  // One write per line, so that threads' lines do not interleave.
  const std::string line = linePrefix(level) + std::string(body) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

} // namespace fairring
