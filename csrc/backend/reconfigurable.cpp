#include <torch_headers.h> // first: the precompiled torch headers

#include "backend/reconfigurable.h"

#ifdef C10D_BACKEND_HAS_RECONFIGURE

#include <algorithm>
#include <random>
#include <unordered_set>
#include <variant>

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace fairring {

namespace {

constexpr const char* kHandlePrefix = "fairring:";

uint64_t drawNonce() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// The handles in rank order: a list as given, a set sorted (every rank sorts
// alike); each a fairring handle, none twice.
std::vector<c10d::ReconfigureHandle> orderedHandles(
    const c10d::ReconfigureOptions& opts) {
  std::vector<c10d::ReconfigureHandle> handles;
  std::visit(
      [&](const auto& given) { handles.assign(given.begin(), given.end()); },
      opts.handles);
  if (std::holds_alternative<std::unordered_set<c10d::ReconfigureHandle>>(
          opts.handles)) {
    std::sort(handles.begin(), handles.end());
  }
  TORCH_CHECK_VALUE(
      !handles.empty(),
      "fairring: reconfigure needs the handles of the new members, this "
      "rank's among them");
  for (const auto& handle : handles) {
    TORCH_CHECK_VALUE(
        handle.rfind(kHandlePrefix, 0) == 0,
        "fairring: '",
        handle,
        "' is not a fairring reconfigure handle (get_reconfigure_handle() of "
        "a fairring group gives one)");
  }
  const std::unordered_set<c10d::ReconfigureHandle> unique(
      handles.begin(), handles.end());
  TORCH_CHECK_VALUE(
      unique.size() == handles.size(),
      "fairring: a reconfigure handle is given twice; pass each member's once");
  return handles;
}

c10::intrusive_ptr<c10d::Work> completedWork() {
  auto future = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()),
      std::vector<c10::Device>{});
  future->markCompleted(c10::IValue(std::vector<at::Tensor>()));
  return c10d::Work::create_from_future(future);
}

} // namespace

ReconfigurableBackend::ReconfigurableBackend(
    c10::intrusive_ptr<c10d::Store> store,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    MakeBackend makeBackend)
    : c10d::Backend(rank, size),
      store_(std::move(store)),
      nonce_(drawNonce()),
      stableRank_(rank),
      makeBackend_(std::move(makeBackend)),
      timeout_(timeout) {
  TORCH_CHECK(store_, "fairring: a store is required");
  TORCH_CHECK(makeBackend_, "fairring: a backend maker is required");
}

ReconfigurableBackend::~ReconfigurableBackend() = default;

c10d::ReconfigureHandle ReconfigurableBackend::get_reconfigure_handle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return c10::str(
      kHandlePrefix, uuid_, ":", stableRank_, ":", std::hex, nonce_);
}

c10::intrusive_ptr<fairring::Backend> ReconfigurableBackend::current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(
      current_,
      "fairring: this group was made with enable_reconfigure=True and has no "
      "members yet; call torch.distributed._reconfigure(uuid, handles) with "
      "every member's get_reconfigure_handle() first");
  return current_;
}

c10::intrusive_ptr<c10d::Work> ReconfigurableBackend::reconfigure(
    const c10d::ReconfigureOptions& opts) {
  std::lock_guard<std::mutex> reconfiguring(reconfiguring_);
  const auto handles = orderedHandles(opts);
  const std::string mine = get_reconfigure_handle();
  const auto found = std::find(handles.begin(), handles.end(), mine);
  int64_t lastUuid = 0;
  std::chrono::milliseconds groupTimeout{};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lastUuid = uuid_;
    groupTimeout = timeout_;
  }
  TORCH_CHECK_VALUE(
      found != handles.end(),
      "fairring: this rank's reconfigure handle '",
      mine,
      "' is not among the ",
      handles.size(),
      " given. Handles name a member as of its last reconfigure (uuid ",
      lastUuid,
      " here): take them from get_reconfigure_handle() after it; an older "
      "one is stale");
  TORCH_CHECK_VALUE(
      opts.uuid != lastUuid,
      "fairring: reconfigure uuid ",
      opts.uuid,
      " is this group's current one; pass a fresh uuid each time");
  const int newRank = static_cast<int>(found - handles.begin());
  const int newSize = static_cast<int>(handles.size());
  const auto timeout = opts.timeout.value_or(groupTimeout);

  // The uuid names this reconfigure's keys. The new rank 0 claims it; every
  // member checks the claim, so a uuid used before fails on every rank
  // instead of meeting that reconfigure's leftover keys.
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      "fairring/reconfigure/" + std::to_string(opts.uuid) + "/", store_);
  if (newRank == 0) {
    store->compareSet(
        "claimed", {}, std::vector<uint8_t>(mine.begin(), mine.end()));
  }
  store->wait({"claimed"}, timeout);
  const auto claimed = store->get("claimed");
  TORCH_CHECK_VALUE(
      std::string(claimed.begin(), claimed.end()) == handles.front(),
      "fairring: reconfigure uuid ",
      opts.uuid,
      " was used before; pass a fresh uuid each time");

  auto made = makeBackend_(store, newRank, newSize, timeout);
  TORCH_CHECK(made, "fairring: reconfigure made no backend");
  made->setTimeout(groupTimeout);
#if FAIRRING_HAS_BACKEND_HOOKS
  std::map<int64_t, c10d::CompletionHook> completionHooks;
  std::map<int64_t, c10d::AbortHook> abortHooks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completionHooks = completionHooks_;
    abortHooks = abortHooks_;
  }
  for (auto& [id, hook] : completionHooks) {
    made->registerCompletionHook(id, std::move(hook));
  }
  for (auto& [id, hook] : abortHooks) {
    made->registerAbortHook(id, std::move(hook));
  }
#endif
  c10::intrusive_ptr<fairring::Backend> old;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    old = std::exchange(current_, made);
    uuid_ = opts.uuid;
    rank_ = newRank;
    size_ = newSize;
  }
  if (old) {
    old->shutdown(); // its pending ops fail, naming this rank's leaving
  }
  return completedWork();
}

c10::intrusive_ptr<fairring::Backend> ReconfigurableBackend::currentIfAny()
    const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

void ReconfigurableBackend::setTimeout(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    timeout_ = timeout;
  }
  if (auto backend = currentIfAny()) {
    backend->setTimeout(timeout);
  }
}

c10d::ErrorType ReconfigurableBackend::getError() {
  auto backend = currentIfAny();
  return backend ? backend->getError() : c10d::ErrorType::SUCCESS;
}

void ReconfigurableBackend::abort() {
  if (auto backend = currentIfAny()) {
    backend->abort();
  }
}

void ReconfigurableBackend::shutdown() {
  if (auto backend = currentIfAny()) {
    backend->shutdown();
  }
}

#if FAIRRING_HAS_BACKEND_HOOKS
void ReconfigurableBackend::registerCompletionHook(
    int64_t id, c10d::CompletionHook hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (current_) {
    current_->registerCompletionHook(id, hook);
  }
  completionHooks_.insert_or_assign(id, std::move(hook));
}

void ReconfigurableBackend::unregisterCompletionHook(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (current_) {
    current_->unregisterCompletionHook(id);
  }
  completionHooks_.erase(id);
}

void ReconfigurableBackend::registerAbortHook(
    int64_t id, c10d::AbortHook hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (current_) {
    current_->registerAbortHook(id, hook);
  }
  abortHooks_.insert_or_assign(id, std::move(hook));
}

void ReconfigurableBackend::unregisterAbortHook(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (current_) {
    current_->unregisterAbortHook(id);
  }
  abortHooks_.erase(id);
}
#endif

} // namespace fairring

#endif // C10D_BACKEND_HAS_RECONFIGURE
