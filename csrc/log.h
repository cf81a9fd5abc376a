#pragma once

#include <optional>
#include <string>

namespace fairring {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

// FAIRRING_LOG_LEVEL, set by fairring._log at each group's creation, with the
// process's rank for its lines. Set, the C++ notices at or above it are
// printed by fairring in the Python log's line format (time, host:pid, rank);
// nullopt (unset), they go through c10's logging, which TORCH_CPP_LOG_LEVEL
// governs as it does NCCL's and Gloo's. Each notice goes one way only.
void setLogLevel(std::optional<LogLevel> level, int rank);

// A notice from any thread: one line, written whole.
void notice(LogLevel level, const std::string& text);

} // namespace fairring
