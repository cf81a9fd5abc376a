#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend/backend.h"
#include "backend/c10d_collectives.h"
#include "backend/hooks.h"

// torch >= 2.15 has c10d's reconfigure contract; older torch has none.
#ifdef C10D_BACKEND_HAS_RECONFIGURE

namespace fairring {

// A fairring group made with init_process_group(enable_reconfigure=True): a
// group whose members are set, and replaced, by reconfigure() (c10d's fault
// tolerance contract, docs/design.md "Reconfigure").
//
// It holds one fairring Backend for the current members and forwards every
// operation to it. reconfigure() makes a whole new Backend for the new
// members (its rendezvous, Gloo group and, at its first all-reduce, its
// engine: every guarantee a group has), swaps it in, then shuts the old one
// down, which fails its pending ops. Until the first reconfigure there is no
// Backend, and every operation says to call reconfigure first.
//
// A handle names one process: "fairring:<uuid>:<rank at creation>:<nonce>",
// where uuid is the last reconfigure's (0 before any) and the nonce is drawn
// when the group is made. A handle from before this rank's last reconfigure
// is stale: it names no current member.
class ReconfigurableBackend final : public c10d::Backend {
 public:
  // Makes the fairring Backend for `rank` of `size` members meeting in
  // `store` (collective over them), or throws.
  using MakeBackend = std::function<c10::intrusive_ptr<fairring::Backend>(
      const c10::intrusive_ptr<c10d::Store>& store,
      int rank,
      int size,
      std::chrono::milliseconds timeout)>;

  ReconfigurableBackend(
      c10::intrusive_ptr<c10d::Store> store,
      int rank,
      int size,
      std::chrono::milliseconds timeout,
      MakeBackend makeBackend);
  ~ReconfigurableBackend() override;

  const std::string getBackendName() const override {
    return "fairring";
  }

  bool supportsReconfigure() const override {
    return true;
  }
  c10d::ReconfigureHandle get_reconfigure_handle() const override;
  c10::intrusive_ptr<c10d::Work> reconfigure(
      const c10d::ReconfigureOptions& opts) override;

  // The Backend of the current members; throws before the first reconfigure.
  c10::intrusive_ptr<fairring::Backend> current() const;

  uint64_t getSequenceNumberForGroup() override {
    return current()->getSequenceNumberForGroup();
  }
  void setSequenceNumberForGroup() override {}
  void setTimeout(std::chrono::milliseconds timeout) override;
  c10d::ErrorType getError() override;
  void eagerConnectSingleDevice(at::Device device) override {
    current()->eagerConnectSingleDevice(device);
  }

#define FAIRRING_FORWARD_COLLECTIVE(name, parameters, arguments) \
  c10::intrusive_ptr<c10d::Work> name parameters override {      \
    return current()->name arguments;                            \
  }
  FAIRRING_C10D_COLLECTIVES(FAIRRING_FORWARD_COLLECTIVE)
#undef FAIRRING_FORWARD_COLLECTIVE
  void monitoredBarrier(
      const c10d::BarrierOptions& opts, bool waitAllRanks) override {
    current()->monitoredBarrier(opts, waitAllRanks);
  }
  bool supportsCoalescing() const override {
    return true;
  }
  void startCoalescing() override {
    current()->startCoalescing();
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    return current()->endCoalescing();
  }

  void abort() override;
  void shutdown() override;

#if FAIRRING_HAS_BACKEND_HOOKS
  // Kept here and given to every Backend of the group as it is made.
  bool supportsCompletionHooks() const override {
    return true;
  }
  void registerCompletionHook(int64_t id, c10d::CompletionHook hook) override;
  void unregisterCompletionHook(int64_t id) override;
  bool supportsAbortHooks() const override {
    return true;
  }
  void registerAbortHook(int64_t id, c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t id) override;
#endif

 private:
  // The current members' Backend; null before the first reconfigure.
  c10::intrusive_ptr<fairring::Backend> currentIfAny() const;

  const c10::intrusive_ptr<c10d::Store> store_;
  const uint64_t nonce_; // tells this process's handles from a restarted one's
  const int stableRank_; // its rank when the group was made
  const MakeBackend makeBackend_;

  // Held through a reconfigure, so that two never interleave.
  std::mutex reconfiguring_;
  mutable std::mutex mutex_; // brief: guards the members below
  std::chrono::milliseconds timeout_;
  int64_t uuid_ = 0; // the last reconfigure's
  c10::intrusive_ptr<fairring::Backend> current_;
#if FAIRRING_HAS_BACKEND_HOOKS
  std::map<int64_t, c10d::CompletionHook> completionHooks_;
  std::map<int64_t, c10d::AbortHook> abortHooks_;
#endif
};

} // namespace fairring

#endif // C10D_BACKEND_HAS_RECONFIGURE
