#include "testing/wire_probe.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <utility>

#include <c10/util/Exception.h>
#include <tensorpipe/tensorpipe.h>

namespace fairring::rails {

namespace {

// What one exchange may allocate here: a test's typo must not eat the machine.
constexpr size_t kMaxBytes = size_t(64) << 20;

// What the pipe's callbacks (on the probe context's loop thread) report to the
// waiting caller. Shared with the callbacks, so it outlives an exchange that
// stopped waiting for them.
struct Progress {
  std::mutex mutex;
  std::condition_variable changed;
  size_t writesDone = 0; // with or without error
  size_t written = 0;
  std::string writeError;
  bool readDone = false;
  std::optional<std::string> reply;
  std::string readError;
};

// Reads one whole message's metadata from `pipe` (no data), or why not;
// nullopt if `timeout` passed first.
std::optional<std::pair<std::string, std::string>> readText(
    const std::shared_ptr<tensorpipe::Pipe>& pipe,
    std::chrono::milliseconds timeout) {
  struct Read {
    std::mutex mutex;
    std::condition_variable changed;
    bool done = false;
    std::string text;
    std::string error;
  };
  auto read = std::make_shared<Read>();
  const auto finish = [read](std::string text, std::string error) {
    std::lock_guard<std::mutex> lock(read->mutex);
    read->done = true;
    read->text = std::move(text);
    read->error = std::move(error);
    read->changed.notify_all();
  };
  pipe->readDescriptor([pipe, finish](
                           const tensorpipe::Error& error,
                           tensorpipe::Descriptor descriptor) {
    if (error) {
      finish("", error.what());
    } else if (!descriptor.tensors.empty() || !descriptor.payloads.empty()) {
      finish("", "a message with data came back");
    } else {
      pipe->read(
          tensorpipe::Allocation{},
          [finish, text = std::move(descriptor.metadata)](
              const tensorpipe::Error& error) {
            finish(error ? "" : text, error ? error.what() : "");
          });
    }
  });
  std::unique_lock<std::mutex> lock(read->mutex);
  if (!read->changed.wait_for(lock, timeout, [&] { return read->done; })) {
    return std::nullopt;
  }
  return std::make_pair(read->text, read->error);
}

// Writes a text to `pipe`: empty, or why not; nullopt on timeout.
std::optional<std::string> writeText(
    const std::shared_ptr<tensorpipe::Pipe>& pipe,
    std::string text,
    std::chrono::milliseconds timeout) {
  auto progress = std::make_shared<Progress>();
  tensorpipe::Message message;
  message.metadata = std::move(text);
  pipe->write(std::move(message), [progress](const tensorpipe::Error& error) {
    std::lock_guard<std::mutex> lock(progress->mutex);
    ++progress->writesDone;
    progress->writeError = error ? error.what() : "";
    progress->changed.notify_all();
  });
  std::unique_lock<std::mutex> lock(progress->mutex);
  if (!progress->changed.wait_for(
          lock, timeout, [&] { return progress->writesDone == 1; })) {
    return std::nullopt;
  }
  return progress->writeError;
}

} // namespace

WireProbe::Handshake WireProbe::handshake(
    const std::string& url,
    const std::string& hello,
    const std::function<std::string(const std::string&)>& answer,
    std::chrono::milliseconds timeout) {
  const auto started = std::chrono::steady_clock::now();
  const std::shared_ptr<tensorpipe::Pipe> pipe = context_->connect(url);
  Handshake result;
  Outcome& outcome = result.outcome;
  // Each step in turn; the first that fails or times out ends it.
  const auto wrote = [&](std::string text) {
    const auto error = writeText(pipe, std::move(text), timeout);
    if (!error) {
      outcome.timedOut = "write";
    } else if (!error->empty()) {
      outcome.writeError = *error;
    } else {
      ++outcome.written;
    }
    return error && error->empty();
  };
  const auto read = [&]() -> std::optional<std::string> {
    const auto text = readText(pipe, timeout);
    if (!text) {
      outcome.timedOut = "read";
    } else if (!text->second.empty()) {
      outcome.readError = text->second;
    } else {
      return text->first;
    }
    return std::nullopt;
  };
  if (wrote(hello)) {
    result.challenge = read();
    if (result.challenge && wrote(answer(*result.challenge))) {
      outcome.reply = read();
    }
  }
  pipe->close();
  outcome.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count();
  return result;
}

WireProbe::WireProbe()
    : context_(
          std::make_shared<tensorpipe::Context>(
              tensorpipe::ContextOptions().name("fairring-wire-probe"))) {
  context_->registerTransport(0, "uv", tensorpipe::transport::uv::create());
  context_->registerChannel(0, "basic", tensorpipe::channel::basic::create());
}

WireProbe::~WireProbe() {
  context_->close();
  context_->join();
}

WireProbe::Outcome WireProbe::exchange(
    const std::string& url,
    const std::vector<Message>& messages,
    bool readReply,
    std::chrono::milliseconds timeout) {
  size_t total = 0;
  const auto count = [&](size_t length) {
    TORCH_CHECK(
        length <= kMaxBytes - total,
        "fairring: a wire probe sends at most ",
        kMaxBytes,
        " bytes of data per exchange");
    total += length;
  };
  for (const auto& spec : messages) {
    std::for_each(spec.payloads.begin(), spec.payloads.end(), count);
    std::for_each(spec.tensors.begin(), spec.tensors.end(), count);
  }
  const auto started = std::chrono::steady_clock::now();
  auto progress = std::make_shared<Progress>();
  const std::shared_ptr<tensorpipe::Pipe> pipe = context_->connect(url);

  for (const auto& spec : messages) {
    // The data, zeros, owned by the write's callback: TensorPipe reads it
    // until then. One spare byte each, so that no pointer is null.
    auto storage = std::make_shared<std::vector<std::vector<uint8_t>>>();
    storage->reserve(spec.payloads.size() + spec.tensors.size());
    tensorpipe::Message message;
    message.metadata = spec.metadata;
    for (size_t length : spec.payloads) {
      auto& bytes = storage->emplace_back(length + 1);
      message.payloads.push_back({bytes.data(), length, ""});
    }
    for (size_t length : spec.tensors) {
      auto& bytes = storage->emplace_back(length + 1);
      tensorpipe::Message::Tensor tensor;
      tensor.buffer = tensorpipe::CpuBuffer{bytes.data()};
      tensor.length = length;
      if (spec.targetCpu) {
        tensor.targetDevice = tensorpipe::Device{tensorpipe::kCpuDeviceType, 0};
      }
      message.tensors.push_back(std::move(tensor));
    }
    pipe->write(
        std::move(message),
        [progress, storage](const tensorpipe::Error& error) {
          std::lock_guard<std::mutex> lock(progress->mutex);
          ++progress->writesDone;
          if (!error) {
            ++progress->written;
          } else if (progress->writeError.empty()) {
            progress->writeError = error.what();
          }
          progress->changed.notify_all();
        });
  }

  Outcome outcome;
  std::unique_lock<std::mutex> lock(progress->mutex);
  if (!progress->changed.wait_for(lock, timeout, [&] {
        return progress->writesDone == messages.size();
      })) {
    outcome.timedOut = "write";
  } else if (readReply) {
    lock.unlock();
    pipe->readDescriptor(
        [progress](
            const tensorpipe::Error& error, tensorpipe::Descriptor descriptor) {
          std::lock_guard<std::mutex> lock(progress->mutex);
          progress->readDone = true;
          if (error) {
            progress->readError = error.what();
          } else {
            progress->reply = std::move(descriptor.metadata);
          }
          progress->changed.notify_all();
        });
    lock.lock();
    if (!progress->changed.wait_for(
            lock, timeout, [&] { return progress->readDone; })) {
      outcome.timedOut = "read";
    }
  }
  outcome.written = progress->written;
  outcome.writeError = progress->writeError;
  outcome.reply = progress->reply;
  outcome.readError = progress->readError;
  lock.unlock();
  // Callbacks still pending fire, with errors, on the loop thread; they only
  // touch `progress`, which they share.
  pipe->close();
  outcome.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count();
  return outcome;
}

} // namespace fairring::rails
