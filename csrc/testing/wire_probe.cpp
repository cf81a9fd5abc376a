#include "testing/wire_probe.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>

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

} // namespace

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
