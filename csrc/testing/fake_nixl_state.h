#pragma once

// Test-only: the fake NIXL's state (testing/fake_nixl.h), shared by the files
// of its calls: the objects its handles point at, the one process-wide
// registry that owns them, and how a call finds its objects under its lock.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rails/peer_text.h"
#include "testing/fake_nixl.h"

namespace fairring::testing::fake_nixl::state {

using rails::parseDecimal;
using rails::nixl::AgentConfig;
using rails::nixl::Api;
using rails::nixl::Handle;
using rails::nixl::kDram;
using rails::nixl::kInProgress;
using rails::nixl::kSuccess;
using rails::nixl::kVram;
using rails::nixl::kWrite;

// Every handle points at one of these, owned by the registry. Calls look
// their handles up and check their kind, so a stale or mixed-up handle is
// refused rather than followed.
struct Object {
  virtual ~Object() = default;
};

struct Region {
  uintptr_t address = 0;
  size_t length = 0;
  bool operator==(const Region&) const = default;
};

// Whether `range` lies wholly inside one of `regions`.
inline bool inside(const std::vector<Region>& regions, const Region& range) {
  for (const Region& region : regions) {
    if (range.address >= region.address && range.length <= region.length &&
        range.address - region.address <= region.length - range.length) {
      return true;
    }
  }
  return false;
}

struct Agent : Object {
  std::string name;
  std::vector<Region> registered;
  // Peers whose metadata was loaded: their regions as it described them.
  std::map<std::string, std::vector<Region>> remotes;
  std::deque<std::pair<std::string, std::string>> inbox; // (sender, bytes)
};

struct StringList : Object {
  std::vector<std::string> items;
};

struct Params : Object {
  std::map<std::string, std::string> values;
};

struct Backend : Object {}; // the agent's one backend: nothing to hold

struct OptArgs : Object {
  std::string message;
  bool hasNotif = false;
};

struct DescList : Object {
  int memoryType = kDram;
  std::vector<Region> entries;
};
// Distinct kinds, so that one is not taken for the other.
struct RegList : DescList {};
struct XferList : DescList {};

struct Request : Object {
  std::string owner; // the agent that made it
  std::string peer;
  std::vector<Region> from; // pairwise with `to`, of equal lengths
  std::vector<Region> to;
  std::string message;
  bool hasNotif = false;
  bool posted = false;
};

// Deques, whose elements stay put as they grow: what notifMapAgentAt and
// notifMapGet hand out stays valid until the map is cleared or destroyed.
struct NotifMap : Object {
  std::deque<std::pair<std::string, std::deque<std::string>>> senders;
};

struct Registry {
  std::mutex mutex; // one for all: meshes call from their own threads
  std::unordered_map<Handle, std::unique_ptr<Object>> objects;
  std::map<std::string, Agent*> agents; // the live ones, by name
  Stats stats;
};

inline Registry& registry() {
  static Registry instance;
  return instance;
}

// The object behind `handle` if it is a T. The caller holds the lock.
template <typename T>
T* find(Registry& r, Handle handle) {
  const auto found = r.objects.find(handle);
  return found == r.objects.end() ? nullptr
                                  : dynamic_cast<T*>(found->second.get());
}

template <typename T>
Handle add(Registry& r, std::unique_ptr<T> object) {
  Handle handle = static_cast<Object*>(object.get());
  r.objects.emplace(handle, std::move(object));
  return handle;
}

inline std::string bytesOf(const void* data, size_t length) {
  return length == 0 ? std::string()
                     : std::string(static_cast<const char*>(data), length);
}

// Runs `body(object, registry)` under the registry's lock, `object` being the
// T behind `handle`, and returns its status; returns kInvalidParam instead if
// there is no such T or `argumentsValid` is false. The latter is the caller's
// check of its other arguments, made before the lock: it reads nothing shared,
// and either failure is kInvalidParam, so the order does not matter.
template <typename T, typename Body>
int withObject(Handle handle, bool argumentsValid, Body&& body) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  T* found = find<T>(r, handle);
  if (found == nullptr || !argumentsValid) {
    return kInvalidParam;
  }
  return body(*found, r);
}

template <typename T>
int create(Handle* handle) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (handle == nullptr) {
    return kInvalidParam;
  }
  *handle = add(r, std::make_unique<T>());
  return kSuccess;
}

template <typename T>
int destroy(Handle handle) {
  return withObject<T>(handle, true, [&](T&, Registry& r) {
    r.objects.erase(handle);
    return kSuccess;
  });
}

// The transfers' and notifications' calls (fake_nixl_transfers.cpp), declared
// by the Api's own member types, so that they cannot drift from it.
template <typename Pointer>
using FunctionOf = std::remove_pointer_t<Pointer>;
FunctionOf<decltype(Api::createXferRequest)> createXferRequest;
FunctionOf<decltype(Api::postXferRequest)> postXferRequest;
FunctionOf<decltype(Api::xferStatus)> xferStatus;
FunctionOf<decltype(Api::releaseXferRequest)> releaseXferRequest;
FunctionOf<decltype(Api::notifs)> notifs;
FunctionOf<decltype(Api::notifMapSize)> notifMapSize;
FunctionOf<decltype(Api::notifMapAgentAt)> notifMapAgentAt;
FunctionOf<decltype(Api::notifMapCount)> notifMapCount;
FunctionOf<decltype(Api::notifMapGet)> notifMapGet;
FunctionOf<decltype(Api::notifMapClear)> notifMapClear;
FunctionOf<decltype(Api::sendNotif)> sendNotif;

} // namespace fairring::testing::fake_nixl::state
