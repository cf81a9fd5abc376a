#pragma once

#include <string>
#include <vector>

namespace fairring {

class Backend;

// What every fairring group of this process has pending on its engines, on
// demand (fairring.pending()) or on a signal (FAIRRING_DUMP_SIGNAL), without
// needing the Python main thread, which may be the one blocked in a wait.
//
// Backends are listed for their lifetime: the constructor's last step adds
// one, the destructor's first removes it, waiting out a report in progress,
// so a report never reads a backend being destroyed.
void listForPendingReport(const Backend* backend);
void unlistForPendingReport(const Backend* backend);

// Every listed backend's pending engine ops, one line each.
std::vector<std::string> pendingReport();

// From now on `signal` makes fairring write pendingReport() to stderr. The
// handler only writes a byte to a pipe (async-signal-safe); a thread of
// fairring's, started by the first call and owned by a static that stops it
// at exit, reads the pipe and writes the report. Another call adds a signal.
void reportPendingOnSignal(int signal);

} // namespace fairring
