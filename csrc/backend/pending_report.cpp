#include <torch_headers.h> // first: the precompiled torch headers

#include "backend/pending_report.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "backend/backend.h"
#include "thread_name.h"

namespace fairring {
namespace {

struct Listed {
  std::mutex mutex; // held for a whole report, and to list or unlist
  std::vector<const Backend*> backends;
};

Listed& listed() {
  static Listed instance;
  return instance;
}

// The write end of the signal pipe, for the handler; -1 when there is none.
std::atomic<int> signalPipe{-1};

extern "C" void onReportSignal(int) {
  const int saved = errno;
  const int fd = signalPipe.load();
  if (fd >= 0) {
    const char wake = 1;
    [[maybe_unused]] const auto written = ::write(fd, &wake, 1);
  }
  errno = saved;
}

void writeToStderr(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const auto n =
        ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return;
    }
    done += static_cast<size_t>(n);
  }
}

// Owns the pipe and the reporting thread; the function-local static in
// reporter() makes them once and stops them at exit: closing the write end
// ends the thread's read.
class SignalReporter {
 public:
  SignalReporter() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      throw std::runtime_error(
          std::string("fairring: no pipe for the pending report: ") +
          std::strerror(errno));
    }
    readEnd_ = fds[0];
    // Non-blocking: a handler never waits on a full pipe (a report is due
    // anyway).
    ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
    signalPipe.store(fds[1]);
    thread_ = std::thread([this] {
      nameThisThread("fr-pending");
      run();
    });
  }
  ~SignalReporter() {
    const int fd = signalPipe.exchange(-1);
    ::close(fd);
    thread_.join();
    ::close(readEnd_);
  }
  SignalReporter(const SignalReporter&) = delete;
  SignalReporter& operator=(const SignalReporter&) = delete;

 private:
  void run() {
    char wake[64];
    while (true) {
      const auto n = ::read(readEnd_, wake, sizeof(wake));
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n <= 0) {
        return; // the write end closed: the process exits
      }
      std::string text;
      const auto lines = pendingReport();
      text += "[fairring " + std::to_string(::getpid()) +
          "] pending: " + (lines.empty() ? "no engine op is pending\n" : "\n");
      for (const auto& line : lines) {
        text +=
            "[fairring " + std::to_string(::getpid()) + "]   " + line + "\n";
      }
      writeToStderr(text);
    }
  }

  int readEnd_ = -1;
  std::thread thread_;
};

SignalReporter& reporter() {
  listed(); // made first, so destroyed after the thread that reads it
  static SignalReporter instance;
  return instance;
}

} // namespace

void listForPendingReport(const Backend* backend) {
  auto& all = listed();
  std::lock_guard<std::mutex> lock(all.mutex);
  all.backends.push_back(backend);
}

void unlistForPendingReport(const Backend* backend) {
  auto& all = listed();
  std::lock_guard<std::mutex> lock(all.mutex);
  std::erase(all.backends, backend);
}

std::vector<std::string> pendingReport() {
  auto& all = listed();
  std::lock_guard<std::mutex> lock(all.mutex);
  std::vector<std::string> lines;
  for (const Backend* backend : all.backends) {
    for (auto& line : backend->pending()) {
      lines.push_back(std::move(line));
    }
  }
  return lines;
}

void reportPendingOnSignal(int signal) {
  reporter(); // the pipe exists before the handler can run
  struct sigaction action{};
  action.sa_handler = onReportSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (::sigaction(signal, &action, nullptr) != 0) {
    throw std::runtime_error(
        "fairring: cannot handle signal " + std::to_string(signal) + ": " +
        std::strerror(errno));
  }
}

} // namespace fairring
