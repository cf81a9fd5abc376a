#include <torch_headers.h> // first: the precompiled torch headers

#include "device/nccl_delegate_model.h"

#include <utility>

#include "backend/c10d_collectives.h"
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

#define FAIRRING_MODEL_COLLECTIVE(name, parameters, arguments)      \
  c10::intrusive_ptr<c10d::Work> name parameters override {         \
    return answered(gloo_->name arguments, asynchronous arguments); \
  }
  FAIRRING_C10D_COLLECTIVES(FAIRRING_MODEL_COLLECTIVE)
#undef FAIRRING_MODEL_COLLECTIVE

  void monitoredBarrier(
      const c10d::BarrierOptions& opts, bool waitAllRanks) override {
    gloo_->monitoredBarrier(opts, waitAllRanks);
  }
  bool supportsCoalescing() const override {
    return gloo_->supportsCoalescing();
  }
  void startCoalescing() override {
    gloo_->startCoalescing();
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    return gloo_->endCoalescing();
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
  // A synchronous operation runs to its end here, as NCCL's kernel is on
  // the caller's stream, and leaves nothing to wait for.
  static c10::intrusive_ptr<c10d::Work> answered(
      c10::intrusive_ptr<c10d::Work> work, bool async) {
    if (async) {
      return work;
    }
    if (work) {
      work->wait();
    }
    return nullptr;
  }

  const c10::intrusive_ptr<c10d::Backend> gloo_;
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
