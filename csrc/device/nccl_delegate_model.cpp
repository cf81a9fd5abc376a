#include <torch_headers.h> // first: the precompiled torch headers

#include "device/nccl_delegate_model.h"

#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "backend/c10d_collectives.h"
#include "backend/work.h"
#include "device/emulated.h"

namespace fairring {

namespace {

// Whether an operation with these arguments is asynchronous: its options'
// asyncOp, where it has options; a point-to-point operation has none, and
// NCCL returns its Work.
template <typename... Arguments>
bool asynchronous(const Arguments&... arguments) {
  bool async = true;
  (
      [&](const auto& argument) {
        if constexpr (requires { argument.asyncOp; }) {
          async = argument.asyncOp;
        }
      }(arguments),
      ...);
  return async;
}

class NcclDelegateModel final : public c10d::Backend {
 public:
  explicit NcclDelegateModel(c10::intrusive_ptr<c10d::Backend> gloo)
      : c10d::Backend(gloo->getRank(), gloo->getSize()),
        gloo_(std::move(gloo)) {}

  const std::string getBackendName() const override {
    return gloo_->getBackendName();
  }

#define FAIRRING_MODEL_COLLECTIVE(name, parameters, arguments)                 \
  c10::intrusive_ptr<c10d::Work> name parameters override {                    \
    return run(                                                                \
        #name, asynchronous arguments, [&] { return gloo_->name arguments; }); \
  }
  FAIRRING_C10D_COLLECTIVES(FAIRRING_MODEL_COLLECTIVE)
#undef FAIRRING_MODEL_COLLECTIVE

  void monitoredBarrier(
      const c10d::BarrierOptions& opts, bool waitAllRanks) override {
    gloo_->monitoredBarrier(opts, waitAllRanks);
  }
  // NCCL coalesces, and its coalescing state is the group's, not a
  // thread's: between startCoalescing and endCoalescing every collective
  // joins the block, whichever thread makes it. Here the members run on
  // Gloo as they are issued, and endCoalescing hands back one Work for
  // them all; a collective from another thread while the block is open is
  // refused, naming what NCCL would have done with it.
  bool supportsCoalescing() const override {
    return true;
  }
  void startCoalescing() override {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(
        !block_, "ProcessGroupNCCL model: startCoalescing inside a block");
    block_.emplace(Block{std::this_thread::get_id(), {}});
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    Block block;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      TORCH_CHECK(
          block_ && block_->owner == std::this_thread::get_id(),
          "ProcessGroupNCCL model: endCoalescing without a block this "
          "thread started");
      block = std::move(*block_);
      block_.reset();
    }
    // NCCL returns no Work for a block that issued nothing.
    if (block.works.empty()) {
      return nullptr;
    }
    return c10::make_intrusive<AllOfWork>(
        std::move(block.works), gloo_->getSequenceNumberForGroup());
  }
  uint64_t getSequenceNumberForGroup() override {
    return gloo_->getSequenceNumberForGroup();
  }
  void setSequenceNumberForGroup() override {
    gloo_->setSequenceNumberForGroup();
  }
  void setTimeout(std::chrono::milliseconds timeout) override {
    gloo_->setTimeout(timeout);
  }
  c10d::ErrorType getError() override {
    return gloo_->getError();
  }
  void abort() override {
    gloo_->abort();
  }
  void shutdown() override {
    gloo_->shutdown();
  }

 private:
  struct Block {
    std::thread::id owner;
    std::vector<c10::intrusive_ptr<c10d::Work>> works; // its members'
  };

  // One thread at a time may be inside ProcessGroupNCCL (its coalescing
  // state and per-device events are not thread-safe), and none but the
  // block's may issue while a block is open. Whether this call is a member
  // of this thread's open block.
  bool enter(const char* name) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto self = std::this_thread::get_id();
    TORCH_CHECK(
        !inside_ || *inside_ == self,
        "ProcessGroupNCCL model: ",
        name,
        " entered while another thread was inside the group");
    TORCH_CHECK(
        !block_ || block_->owner == self,
        "ProcessGroupNCCL model: ",
        name,
        " issued on another thread while a coalescing block was open: NCCL's "
        "coalescing state is its group's, so it would have joined the block");
    inside_ = self;
    return block_.has_value();
  }
  void leave() {
    std::lock_guard<std::mutex> lock(mutex_);
    inside_.reset();
  }
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> run(const char* name, bool async, Call call) {
    const bool inBlock = enter(name);
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = call();
    } catch (...) {
      leave();
      throw;
    }
    leave();
    return answered(std::move(work), async, inBlock);
  }

  // A synchronous operation runs to its end here, as NCCL's kernel is on
  // the caller's stream, and leaves nothing to wait for; a block's member
  // runs now too, and its block's Work covers it.
  c10::intrusive_ptr<c10d::Work> answered(
      c10::intrusive_ptr<c10d::Work> work, bool async, bool inBlock) {
    if (inBlock) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (work && block_) {
        block_->works.push_back(work);
      }
      return async ? work : nullptr;
    }
    if (async) {
      return work;
    }
    if (work) {
      work->wait();
    }
    return nullptr;
  }

  const c10::intrusive_ptr<c10d::Backend> gloo_;
  std::mutex mutex_;
  std::optional<std::thread::id> inside_; // the thread in a collective call
  std::optional<Block> block_;
};

} // namespace

c10::intrusive_ptr<c10d::Backend> asEmulatedDeviceDelegate(
    c10::intrusive_ptr<c10d::Backend> gloo) {
  const auto emulated = emulatedDeviceFromEnv();
  if (!gloo || !emulated || !emulated->ncclDelegate) {
    return gloo;
  }
  return c10::make_intrusive<NcclDelegateModel>(std::move(gloo));
}

} // namespace fairring
