#include "device/emulated.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <string_view>
#include <thread>
#include <unordered_map>

#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>

#include "device/capture.h"
#include "device/streamed.h"
#include "test_switches.h"
#include "thread_name.h"

namespace fairring {

namespace {

// One emulated stream: a worker thread (owned, joined by join()) that runs
// its items in push order. An item's position is its 1-based push count.
class EmulatedStream {
 public:
  EmulatedStream(uint64_t seed, std::chrono::microseconds jitter)
      : random_(seed), jitter_(jitter), worker_([this] {
          nameThisThread("fr-emu-stream");
          run();
        }) {}
  ~EmulatedStream() {
    join();
  }

  // Returns the position after `work`; `jitter`: sleep first, as device work
  // takes time (not for bookkeeping items).
  uint64_t push(std::function<void()> work, bool jitter = true) {
    uint64_t position = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      position = ++pushed_;
      if (aborted_) {
        done_ = pushed_;
        return position;
      }
      queue_.push_back(Item{std::move(work), jitter});
    }
    changed_.notify_all();
    return position;
  }

  uint64_t position() {
    std::lock_guard<std::mutex> lock(mutex_);
    return pushed_;
  }

  bool reached(uint64_t position) {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_ >= position || aborted_;
  }

  // Blocks the calling thread (another stream's worker, or the host) until
  // this stream has run every item up to `position`, or is aborted.
  void awaitReached(uint64_t position) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_ >= position || aborted_; });
  }
  // The same for at most `timeout`: whether it was reached.
  bool awaitReached(uint64_t position, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(
        lock, timeout, [&] { return done_ >= position || aborted_; });
  }

  void abort() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      aborted_ = true;
      queue_.clear();
      done_ = pushed_;
    }
    changed_.notify_all();
  }

  void join() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    if (worker_.joinable()) {
      worker_.join();
    }
  }

 private:
  struct Item {
    std::function<void()> work;
    bool jitter;
  };

  // The worker: one item at a time, in order, until joined; an aborted
  // stream drops what is queued.
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) {
        return; // stopping, nothing left
      }
      Item item = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      if (item.jitter && jitter_.count() > 0) {
        std::uniform_int_distribution<int64_t> pause(0, jitter_.count());
        std::this_thread::sleep_for(std::chrono::microseconds(pause(random_)));
      }
      try {
        item.work();
      } catch (const std::exception&) {
        // The engine's work reports its own errors; a stray one must not
        // end the process from a worker thread.
      }
      item.work = nullptr; // what it kept alive goes before it counts as done
      lock.lock();
      if (!aborted_) {
        ++done_;
      }
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> queue_;
  uint64_t pushed_ = 0;
  uint64_t done_ = 0;
  bool aborted_ = false;
  bool stopping_ = false;
  std::mt19937_64 random_; // the worker's only
  const std::chrono::microseconds jitter_;
  std::thread worker_; // last: it uses the members above
};

struct EmulatedFence final : FenceState {
  EmulatedFence(
      std::shared_ptr<EmulatedStream> stream, int index, uint64_t position)
      : stream(std::move(stream)), index(index), position(position) {}
  std::shared_ptr<EmulatedStream> stream;
  int index; // StreamPolicy::Stream
  uint64_t position;
};

// The caller's work as CUDA would record it during a graph capture
// (CaptureModel): an event recorded into the graph, which no thread may query
// and no stream outside the capture may wait for. Either is recorded as a
// violation; the work itself is done (a CPU caller's is, when it issues).
struct CapturedFence final : FenceState {};

bool capturedFence(const Fence& fence, const char* use) {
  if (dynamic_cast<const CapturedFence*>(fence.state()) == nullptr) {
    return false;
  }
  CaptureModel::violated(
      std::string("the engine ") + use +
      " an event the caller recorded during graph capture");
  return true;
}

// The caller's stream, as CUDA's current stream is: one for the process,
// made at its first use (the caller_stream setting), living as long.
class CallerStream {
 public:
  static const std::shared_ptr<EmulatedStream>& get() {
    static CallerStream holder;
    return holder.stream_;
  }
  // Whether the process is exiting: holds stop waiting, so that the
  // stream's worker can be joined.
  static bool closing() {
    return closing_;
  }

 private:
  CallerStream()
      : stream_(
            std::make_shared<EmulatedStream>(
                /*seed=*/0, std::chrono::microseconds(0))) {}
  ~CallerStream() {
    closing_ = true;
  }

  static inline std::atomic<bool> closing_{false};
  std::shared_ptr<EmulatedStream> stream_;
};

// An engine's signals (DeviceContext::raiseSignal), as CUDA's words: raised
// by the host, waited for by items on the engine's streams, which end once
// the signal reached their ticket, the signals are opened, or the device is
// joined (its streams must drain; CUDA's would be retired).
class EmulatedSignals {
 public:
  void raise(Signal signal, uint32_t ticket) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      uint32_t& raised = raised_[static_cast<int>(signal)];
      raised = laterTicket(raised, ticket);
    }
    changed_.notify_all();
  }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      opened_ = true;
    }
    changed_.notify_all();
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
    }
    changed_.notify_all();
  }
  void await(Signal signal, uint32_t ticket) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] {
      return opened_ || closing_ ||
          ticketReleased(raised_[static_cast<int>(signal)], ticket);
    });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::array<uint32_t, kSignals> raised_{};
  bool opened_ = false;
  bool closing_ = false;
};

class EmulatedStreams final : public StreamPolicy {
 public:
  EmulatedStreams(const EmulatedDeviceSettings& settings, int rank)
      : settings_(settings) {
    for (int stream = 0; stream < kStreams; ++stream) {
      streams_[stream] = settings.inOrder && stream > 0
          ? streams_[0] // one queue for all: a fence is a position in it
          : std::make_shared<EmulatedStream>(
                settings.seed * 7919 + static_cast<uint64_t>(rank) * kStreams +
                    stream,
                settings.jitter);
    }
  }

  c10::Device device() const override {
    return c10::Device(c10::kCPU);
  }
  std::vector<c10::Device> futureDevices() const override {
    return {};
  }
  int64_t minShardBytes() const override {
    return kCudaMinShardBytes; // CUDA's plans
  }
  bool mayRunInLaunchOrder() const override {
    return !settings_.unorderedLaunch;
  }

  Fence recordCaller() override {
    if (CaptureModel::onThisThread()) {
      return Fence(std::make_shared<CapturedFence>());
    }
    if (settings_.callerStream) {
      const auto& caller = CallerStream::get();
      return Fence(
          std::make_shared<EmulatedFence>(
              caller, kCallerStream, caller->position()));
    }
    return Fence(); // a CPU caller's work is done when it issues
  }

  bool launchesAhead() const override {
    return settings_.callerStream && !settings_.hostWaits;
  }
  at::TensorOptions railsMemoryOptions() const override {
    return at::TensorOptions().device(c10::kCPU);
  }
  void waitForSignal(int stream, Signal signal, uint32_t ticket) override {
    if (settings_.ignoreArrivals) {
      return;
    }
    streams_[stream]->push(
        [signals = signals_, signal, ticket] {
          signals->await(signal, ticket);
        },
        /*jitter=*/false);
  }
  void raiseSignal(Signal signal, uint32_t ticket) override {
    signals_->raise(signal, ticket);
  }
  void openSignals() override {
    if (!settings_.signalsStayShut) {
      signals_->open();
    }
  }
  std::chrono::milliseconds receivedCopyDelay() const override {
    return settings_.receiveDelay;
  }
  std::function<bool(const Fence&)> callerWaiter() override {
    if (!launchesAhead()) {
      return nullptr;
    }
    return [unordered = settings_.callerUnordered](const Fence& fence) {
      if (capturedFence(fence, "made the caller's stream wait for")) {
        return false;
      }
      const auto* state = static_cast<const EmulatedFence*>(fence.state());
      if (state == nullptr) {
        return false;
      }
      CallerStream::get()->push(
          [unordered, awaited = state->stream, position = state->position] {
            while (!unordered &&
                   !awaited->awaitReached(
                       position, std::chrono::milliseconds(10)) &&
                   !CallerStream::closing()) {
            }
          },
          /*jitter=*/false);
      return true;
    };
  }

  void issue(int stream, Queue issuer, std::function<void()> work) override {
    holdForForcedOrder(issuer);
    streams_[stream]->push(std::move(work));
    {
      std::lock_guard<std::mutex> lock(forceMutex_);
      ++issued_[static_cast<int>(issuer)];
    }
    forceChanged_.notify_all();
  }

  Fence record(int stream) override {
    return fenceAt(stream, streams_[stream]->position());
  }

  void wait(int stream, const Fence& fence) override {
    if (capturedFence(fence, "made a stream wait for")) {
      return;
    }
    const auto* state = static_cast<const EmulatedFence*>(fence.state());
    if (state == nullptr ||
        (settings_.ignoreArrivals && state->index == kReceiveStream)) {
      return;
    }
    streams_[stream]->push(
        [awaited = state->stream, position = state->position] {
          awaited->awaitReached(position);
        },
        /*jitter=*/false);
  }

  bool query(const Fence& fence) override {
    if (capturedFence(fence, "queried")) {
      return true;
    }
    const auto* state = static_cast<const EmulatedFence*>(fence.state());
    return state == nullptr || state->stream->reached(state->position);
  }

  void recordUse(const at::Tensor& tensor, int stream) override {
    // Held until the stream has run what was queued before: recordStream.
    streams_[stream]->push([kept = tensor] {}, /*jitter=*/false);
  }

  rails::Buffer sendBuffer(const at::Tensor& tensor) override {
    // cuda_basic copies out on the send stream before the bytes leave; the
    // copy waits for nothing else queued there.
    const uint64_t copied = streams_[kSendStream]->push([] {}, /*jitter=*/true);
    streams_[kSendStream]->awaitReached(copied);
    return hostBuffer(tensor);
  }

  rails::Buffer receiveBuffer(const at::Tensor& tensor) override {
    at::Tensor bounce = at::empty_like(tensor);
    rails::Buffer buffer = hostBuffer(bounce);
    std::lock_guard<std::mutex> lock(bouncesMutex_);
    bounces_.insert_or_assign(buffer.data, Bounce{std::move(bounce), tensor});
    return buffer;
  }

  Fence received(const rails::Buffer& received) override {
    Bounce bounce;
    {
      std::lock_guard<std::mutex> lock(bouncesMutex_);
      auto found = bounces_.find(received.data);
      TORCH_CHECK(
          found != bounces_.end(), "fairring: an unknown receive completed");
      bounce = std::move(found->second);
      bounces_.erase(found);
    }
    const uint64_t copied = streams_[kReceiveStream]->push(
        [bounce = std::move(bounce), delay = settings_.receiveDelay]() mutable {
          std::this_thread::sleep_for(delay);
          bounce.target.copy_(bounce.bytes);
        });
    return fenceAt(kReceiveStream, copied);
  }

  void abort() override {
    // A device that launches ahead is CUDA's model: launched work cannot be
    // taken back, and runs out once the engine opens its signals.
    if (!launchesAhead()) {
      for (const auto& stream : streams_) {
        stream->abort();
      }
    }
    {
      std::lock_guard<std::mutex> lock(forceMutex_);
      aborted_ = true;
    }
    forceChanged_.notify_all();
  }

  void join() override {
    signals_->close(); // the streams drain
    for (const auto& stream : streams_) {
      stream->join();
    }
  }

 private:
  struct Bounce {
    at::Tensor bytes; // what the rails received into
    at::Tensor target;
  };

  Fence fenceAt(int stream, uint64_t position) const {
    return Fence(
        std::make_shared<EmulatedFence>(streams_[stream], stream, position));
  }

  // The forced interleaving: `issuer`'s enqueue waits for the other local
  // step's next one, for at most 500 ms. The reduce-scatter is the input
  // queue's work, the all-gather the output queue's.
  void holdForForcedOrder(Queue issuer) {
    using Force = EmulatedDeviceSettings::Force;
    Queue awaited;
    if (settings_.force == Force::kReduceScatterFirst &&
        issuer == Queue::kOutput) {
      awaited = Queue::kInput;
    } else if (
        settings_.force == Force::kAllGatherFirst && issuer == Queue::kInput) {
      awaited = Queue::kOutput;
    } else {
      return;
    }
    std::unique_lock<std::mutex> lock(forceMutex_);
    const int64_t before = issued_[static_cast<int>(awaited)];
    forceChanged_.wait_for(lock, std::chrono::milliseconds(500), [&] {
      return aborted_ || issued_[static_cast<int>(awaited)] > before;
    });
  }

  // EmulatedFence::index of the caller's stream, which is not the policy's.
  static constexpr int kCallerStream = -1;

  const EmulatedDeviceSettings settings_;
  std::array<std::shared_ptr<EmulatedStream>, kStreams> streams_;
  const std::shared_ptr<EmulatedSignals> signals_ =
      std::make_shared<EmulatedSignals>();
  std::mutex bouncesMutex_;
  std::unordered_map<void*, Bounce> bounces_; // by the rails' buffer
  std::mutex forceMutex_;
  std::condition_variable forceChanged_;
  std::array<int64_t, kQueues> issued_{}; // work enqueued, by queue
  bool aborted_ = false;
};

int64_t parseNumber(std::string_view text, std::string_view item) {
  try {
    size_t used = 0;
    const int64_t value = std::stoll(std::string(text), &used);
    if (used == text.size() && value >= 0) {
      return value;
    }
  } catch (const std::exception&) {
  }
  TORCH_CHECK(
      false,
      "fairring: FAIRRING_TEST_EMULATED_DEVICE: '",
      item,
      "' needs a non-negative integer");
}

} // namespace

void enqueueOnEmulatedCallerStream(std::function<void()> work) {
  CallerStream::get()->push(std::move(work), /*jitter=*/false);
}

bool synchronizeEmulatedCallerStream(std::chrono::milliseconds timeout) {
  const auto& caller = CallerStream::get();
  return caller->awaitReached(caller->position(), timeout);
}

std::optional<EmulatedDeviceSettings> emulatedDeviceFromEnv() {
  const auto value = testSwitch(TestSwitch::kEmulatedDevice);
  if (!value) {
    return std::nullopt;
  }
  EmulatedDeviceSettings settings;
  std::string_view rest(*value);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view()
                                           : rest.substr(comma + 1);
    const size_t equals = item.find('=');
    const std::string_view key = item.substr(0, equals);
    const std::string_view argument = equals == std::string_view::npos
        ? std::string_view()
        : item.substr(equals + 1);
    if (key == "on" || key.empty()) {
    } else if (key == "seed") {
      settings.seed = static_cast<uint64_t>(parseNumber(argument, item));
    } else if (key == "jitter_us") {
      settings.jitter = std::chrono::microseconds(parseNumber(argument, item));
    } else if (key == "in_order") {
      settings.inOrder = true;
    } else if (key == "unordered_launch") {
      settings.unorderedLaunch = true;
    } else if (key == "eager_engine") {
      settings.eagerEngine = true;
    } else if (key == "nccl_delegate") {
      settings.ncclDelegate = true;
    } else if (key == "caller_stream") {
      settings.callerStream = true;
    } else if (key == "host_waits") {
      settings.hostWaits = true;
    } else if (key == "caller_unordered") {
      settings.callerUnordered = true;
    } else if (key == "signals_stay_shut") {
      settings.signalsStayShut = true;
    } else if (key == "ignore_arrivals") {
      settings.ignoreArrivals = true;
    } else if (key == "receive_delay_ms") {
      settings.receiveDelay =
          std::chrono::milliseconds(parseNumber(argument, item));
    } else if (key == "force" && argument == "rs_first") {
      settings.force = EmulatedDeviceSettings::Force::kReduceScatterFirst;
    } else if (key == "force" && argument == "ag_first") {
      settings.force = EmulatedDeviceSettings::Force::kAllGatherFirst;
    } else {
      TORCH_CHECK(
          false,
          "fairring: FAIRRING_TEST_EMULATED_DEVICE: unknown item '",
          item,
          "' (see csrc/device/emulated.h)");
    }
  }
  return settings;
}

std::unique_ptr<DeviceContext> makeEmulatedContext(
    const EmulatedDeviceSettings& settings, int rank) {
  return std::make_unique<StreamedContext>(
      std::make_unique<EmulatedStreams>(settings, rank));
}

} // namespace fairring
