#include "testing/fake_nixl.h"

#include "testing/fake_nixl_state.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "rails/peer_text.h"

namespace fairring::testing::fake_nixl {

// This file's calls, api() and the tests' hooks all work on the state.
using namespace state; // NOLINT(google-build-using-namespace)

namespace {

// Agents.

int createAgent(
    const char* name, const AgentConfig* /*config*/, Handle* agent) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  // Metadata is line by line: a name is one line.
  if (name == nullptr || *name == '\0' || std::strchr(name, '\n') != nullptr ||
      agent == nullptr) {
    return kInvalidParam;
  }
  if (r.agents.count(name) > 0) {
    return kInvalidState;
  }
  auto made = std::make_unique<Agent>();
  made->name = name;
  r.agents[made->name] = made.get();
  *agent = add(r, std::move(made));
  return kSuccess;
}

int destroyAgent(Handle handle) {
  return withObject<Agent>(handle, true, [&](Agent& found, Registry& r) {
    // Peers keep its metadata, as real ones would: their writes and
    // notifications to it fail from now on.
    r.agents.erase(found.name);
    r.objects.erase(handle); // last: `found` goes with it
    return kSuccess;
  });
}

int availablePlugins(Handle agent, Handle* list) {
  return withObject<Agent>(agent, list != nullptr, [&](Agent&, Registry& r) {
    auto made = std::make_unique<StringList>();
    made->items = {"UCX", "LIBFABRIC"};
    *list = add(r, std::move(made));
    return kSuccess;
  });
}

int stringListSize(Handle list, size_t* size) {
  return withObject<StringList>(
      list, size != nullptr, [&](const StringList& found, Registry&) {
        *size = found.items.size();
        return kSuccess;
      });
}

int stringListGet(Handle list, size_t index, const char** text) {
  return withObject<StringList>(
      list, text != nullptr, [&](const StringList& found, Registry&) -> int {
        if (index >= found.items.size()) {
          return kInvalidParam;
        }
        *text = found.items[index].c_str();
        return kSuccess;
      });
}

int paramsAdd(Handle params, const char* key, const char* value) {
  const bool valid = key != nullptr && value != nullptr;
  return withObject<Params>(params, valid, [&](Params& found, Registry&) {
    found.values[key] = value;
    return kSuccess;
  });
}

int createBackend(
    Handle agent, const char* plugin, Handle params, Handle* backend) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (find<Agent>(r, agent) == nullptr || plugin == nullptr ||
      (params != nullptr && find<Params>(r, params) == nullptr) ||
      backend == nullptr) {
    return kInvalidParam;
  }
  // UCX only, so that tests see how the mesh reports a missing backend.
  if (std::string_view(plugin) != "UCX") {
    return kBackend;
  }
  *backend = add(r, std::make_unique<Backend>());
  return kSuccess;
}

// Optional arguments.

int optArgsAddBackend(Handle args, Handle backend) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (find<OptArgs>(r, args) == nullptr ||
      find<Backend>(r, backend) == nullptr) {
    return kInvalidParam;
  }
  return kSuccess;
}

int optArgsSetNotifMessage(Handle args, const void* data, size_t length) {
  const bool valid = data != nullptr || length == 0;
  return withObject<OptArgs>(args, valid, [&](OptArgs& found, Registry&) {
    found.message = bytesOf(data, length);
    return kSuccess;
  });
}

int optArgsSetHasNotif(Handle args, bool hasNotif) {
  return withObject<OptArgs>(args, true, [&](OptArgs& found, Registry&) {
    found.hasNotif = hasNotif;
    return kSuccess;
  });
}

// Descriptor lists, for registration and for transfers.

template <typename T>
int createList(int memoryType, Handle* list) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if ((memoryType != kDram && memoryType != kVram) || list == nullptr) {
    return kInvalidParam;
  }
  auto made = std::make_unique<T>();
  made->memoryType = memoryType;
  *list = add(r, std::move(made));
  return kSuccess;
}

template <typename T>
int addToList(Handle list, uintptr_t address, size_t length) {
  const bool valid = length > 0 && address <= UINTPTR_MAX - length;
  return withObject<T>(list, valid, [&](T& found, Registry&) {
    found.entries.push_back(Region{address, length});
    return kSuccess;
  });
}

int regListAdd(
    Handle list,
    uintptr_t address,
    size_t length,
    uint64_t /*deviceId*/,
    const void* /*metadata*/,
    size_t /*metadataLength*/) {
  return addToList<RegList>(list, address, length);
}

int xferListAdd(
    Handle list, uintptr_t address, size_t length, uint64_t /*deviceId*/) {
  return addToList<XferList>(list, address, length);
}

// Registration.

int registerMemory(Handle agent, Handle list, Handle args) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Agent* found = find<Agent>(r, agent);
  const RegList* regions = find<RegList>(r, list);
  if (found == nullptr || regions == nullptr ||
      (args != nullptr && find<OptArgs>(r, args) == nullptr)) {
    return kInvalidParam;
  }
  if (regions->memoryType != kDram) {
    return kBackend;
  }
  found->registered.insert(
      found->registered.end(),
      regions->entries.begin(),
      regions->entries.end());
  return kSuccess;
}

int deregisterMemory(Handle agent, Handle list, Handle args) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Agent* found = find<Agent>(r, agent);
  const RegList* regions = find<RegList>(r, list);
  if (found == nullptr || regions == nullptr ||
      (args != nullptr && find<OptArgs>(r, args) == nullptr)) {
    return kInvalidParam;
  }
  // All or nothing: every entry must be registered.
  std::vector<Region> left = found->registered;
  for (const Region& region : regions->entries) {
    const auto at = std::find(left.begin(), left.end(), region);
    if (at == left.end()) {
      return kNotFound;
    }
    left.erase(at);
  }
  found->registered = std::move(left);
  return kSuccess;
}

// Metadata: "fake-nixl-agent <name>\n", then "region <address> <length>\n"
// for each registered region, in decimal.

constexpr std::string_view kAgentLine = "fake-nixl-agent ";
constexpr std::string_view kRegionLine = "region ";

struct Description {
  std::string name;
  std::vector<Region> regions;
};

std::string describe(const Agent& agent) {
  std::string text = std::string(kAgentLine) + agent.name + "\n";
  for (const Region& region : agent.registered) {
    text += std::string(kRegionLine) + std::to_string(region.address) + " " +
        std::to_string(region.length) + "\n";
  }
  return text;
}

// What describe() wrote, or nothing if anything else is there.
std::optional<Description> parseDescription(std::string_view text) {
  Description description;
  bool first = true;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    if (end == std::string_view::npos) {
      return std::nullopt;
    }
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(end + 1);
    if (first) {
      first = false;
      if (!line.starts_with(kAgentLine)) {
        return std::nullopt;
      }
      description.name = line.substr(kAgentLine.size());
      if (description.name.empty() ||
          description.name.find('\0') != std::string::npos) {
        return std::nullopt;
      }
      continue;
    }
    if (!line.starts_with(kRegionLine)) {
      return std::nullopt;
    }
    const std::string_view numbers = line.substr(kRegionLine.size());
    const size_t space = numbers.find(' ');
    if (space == std::string_view::npos) {
      return std::nullopt;
    }
    const auto address = parseDecimal<uintptr_t>(numbers.substr(0, space));
    const auto length = parseDecimal<size_t>(numbers.substr(space + 1));
    if (!address || !length || *length == 0 ||
        *address > UINTPTR_MAX - *length) {
      return std::nullopt;
    }
    description.regions.push_back(Region{*address, *length});
  }
  if (first) {
    return std::nullopt; // empty
  }
  return description;
}

int localMetadata(Handle agent, void** data, size_t* length) {
  const bool valid = data != nullptr && length != nullptr;
  return withObject<Agent>(
      agent, valid, [&](const Agent& found, Registry&) -> int {
        const std::string text = describe(found);
        // The caller releases it with std::free.
        void* copy = std::malloc(text.size());
        if (copy == nullptr) {
          return kBackend;
        }
        std::memcpy(copy, text.data(), text.size());
        *data = copy;
        *length = text.size();
        return kSuccess;
      });
}

int loadRemoteMetadata(
    Handle agent, const void* data, size_t length, char** agentName) {
  const bool valid = agentName != nullptr && (data != nullptr || length == 0);
  return withObject<Agent>(agent, valid, [&](Agent& found, Registry&) -> int {
    auto description = parseDescription(bytesOf(data, length));
    if (!description || description->name == found.name) {
      return kInvalidParam;
    }
    // The caller releases it with std::free.
    char* name = static_cast<char*>(std::malloc(description->name.size() + 1));
    if (name == nullptr) {
      return kBackend;
    }
    std::memcpy(name, description->name.c_str(), description->name.size() + 1);
    // Trusted as described, as NIXL does; a later load replaces it.
    found.remotes[description->name] = std::move(description->regions);
    *agentName = name;
    return kSuccess;
  });
}

int invalidateRemoteMetadata(Handle agent, const char* remoteAgent) {
  return withObject<Agent>(
      agent, remoteAgent != nullptr, [&](Agent& found, Registry&) -> int {
        if (found.remotes.erase(remoteAgent) == 0) {
          return kNotFound;
        }
        return kSuccess;
      });
}

} // namespace

const Api& api() {
  // Designated in the order Api declares them; checked by the compiler.
  static const Api table{
      .createAgent = createAgent,
      .destroyAgent = destroyAgent,
      .availablePlugins = availablePlugins,
      .stringListSize = stringListSize,
      .stringListGet = stringListGet,
      .destroyStringList = destroy<StringList>,
      .createParams = create<Params>,
      .paramsAdd = paramsAdd,
      .destroyParams = destroy<Params>,
      .createBackend = createBackend,
      .destroyBackend = destroy<Backend>,
      .createOptArgs = create<OptArgs>,
      .optArgsAddBackend = optArgsAddBackend,
      .optArgsSetNotifMessage = optArgsSetNotifMessage,
      .optArgsSetHasNotif = optArgsSetHasNotif,
      .destroyOptArgs = destroy<OptArgs>,
      .createRegList = createList<RegList>,
      .regListAdd = regListAdd,
      .destroyRegList = destroy<RegList>,
      .registerMemory = registerMemory,
      .deregisterMemory = deregisterMemory,
      .localMetadata = localMetadata,
      .loadRemoteMetadata = loadRemoteMetadata,
      .invalidateRemoteMetadata = invalidateRemoteMetadata,
      .createXferList = createList<XferList>,
      .xferListAdd = xferListAdd,
      .destroyXferList = destroy<XferList>,
      .createXferRequest = createXferRequest,
      .postXferRequest = postXferRequest,
      .xferStatus = xferStatus,
      .releaseXferRequest = releaseXferRequest,
      .destroyXferRequest = destroy<Request>,
      .createNotifMap = create<NotifMap>,
      .destroyNotifMap = destroy<NotifMap>,
      .notifs = notifs,
      .notifMapSize = notifMapSize,
      .notifMapAgentAt = notifMapAgentAt,
      .notifMapCount = notifMapCount,
      .notifMapGet = notifMapGet,
      .notifMapClear = notifMapClear,
      .sendNotif = sendNotif,
  };
  return table;
}

void reset() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.agents.clear(); // first: it points into `objects`
  r.objects.clear();
  r.stats = Stats{};
}

bool inject(
    const std::string& from, const std::string& to, const std::string& bytes) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto found = r.agents.find(to);
  if (found == r.agents.end()) {
    return false;
  }
  found->second->inbox.emplace_back(from, bytes);
  return true;
}

std::vector<std::string> agents() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, agent] : r.agents) {
    names.push_back(name);
  }
  return names;
}

Stats stats() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.stats;
}

} // namespace fairring::testing::fake_nixl
