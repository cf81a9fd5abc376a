#include "testing/fake_nixl.h"

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

namespace {

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
bool inside(const std::vector<Region>& regions, const Region& range) {
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

Registry& registry() {
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

std::string bytesOf(const void* data, size_t length) {
  return length == 0 ? std::string()
                     : std::string(static_cast<const char*>(data), length);
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
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (find<T>(r, handle) == nullptr) {
    return kInvalidParam;
  }
  r.objects.erase(handle);
  return kSuccess;
}

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
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const Agent* agent = find<Agent>(r, handle);
  if (agent == nullptr) {
    return kInvalidParam;
  }
  // Peers keep its metadata, as real ones would: their writes and
  // notifications to it fail from now on.
  r.agents.erase(agent->name);
  r.objects.erase(handle);
  return kSuccess;
}

int availablePlugins(Handle agent, Handle* list) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (find<Agent>(r, agent) == nullptr || list == nullptr) {
    return kInvalidParam;
  }
  auto made = std::make_unique<StringList>();
  made->items = {"UCX", "LIBFABRIC"};
  *list = add(r, std::move(made));
  return kSuccess;
}

int stringListSize(Handle list, size_t* size) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const StringList* found = find<StringList>(r, list);
  if (found == nullptr || size == nullptr) {
    return kInvalidParam;
  }
  *size = found->items.size();
  return kSuccess;
}

int stringListGet(Handle list, size_t index, const char** text) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const StringList* found = find<StringList>(r, list);
  if (found == nullptr || text == nullptr || index >= found->items.size()) {
    return kInvalidParam;
  }
  *text = found->items[index].c_str();
  return kSuccess;
}

int paramsAdd(Handle params, const char* key, const char* value) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Params* found = find<Params>(r, params);
  if (found == nullptr || key == nullptr || value == nullptr) {
    return kInvalidParam;
  }
  found->values[key] = value;
  return kSuccess;
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
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  OptArgs* found = find<OptArgs>(r, args);
  if (found == nullptr || (data == nullptr && length > 0)) {
    return kInvalidParam;
  }
  found->message = bytesOf(data, length);
  return kSuccess;
}

int optArgsSetHasNotif(Handle args, bool hasNotif) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  OptArgs* found = find<OptArgs>(r, args);
  if (found == nullptr) {
    return kInvalidParam;
  }
  found->hasNotif = hasNotif;
  return kSuccess;
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
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  T* found = find<T>(r, list);
  if (found == nullptr || length == 0 || address > UINTPTR_MAX - length) {
    return kInvalidParam;
  }
  found->entries.push_back(Region{address, length});
  return kSuccess;
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
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const Agent* found = find<Agent>(r, agent);
  if (found == nullptr || data == nullptr || length == nullptr) {
    return kInvalidParam;
  }
  const std::string text = describe(*found);
  // The caller releases it with std::free.
  void* copy = std::malloc(text.size());
  if (copy == nullptr) {
    return kBackend;
  }
  std::memcpy(copy, text.data(), text.size());
  *data = copy;
  *length = text.size();
  return kSuccess;
}

int loadRemoteMetadata(
    Handle agent, const void* data, size_t length, char** agentName) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Agent* found = find<Agent>(r, agent);
  if (found == nullptr || agentName == nullptr ||
      (data == nullptr && length > 0)) {
    return kInvalidParam;
  }
  auto description = parseDescription(bytesOf(data, length));
  if (!description || description->name == found->name) {
    return kInvalidParam;
  }
  // The caller releases it with std::free.
  char* name = static_cast<char*>(std::malloc(description->name.size() + 1));
  if (name == nullptr) {
    return kBackend;
  }
  std::memcpy(name, description->name.c_str(), description->name.size() + 1);
  // Trusted as described, as NIXL does; a later load replaces it.
  found->remotes[description->name] = std::move(description->regions);
  *agentName = name;
  return kSuccess;
}

int invalidateRemoteMetadata(Handle agent, const char* remoteAgent) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Agent* found = find<Agent>(r, agent);
  if (found == nullptr || remoteAgent == nullptr) {
    return kInvalidParam;
  }
  if (found->remotes.erase(remoteAgent) == 0) {
    return kNotFound;
  }
  return kSuccess;
}

// Transfers.

int createXferRequest(
    Handle agent,
    int operation,
    Handle local,
    Handle remote,
    const char* remoteAgent,
    Handle* request,
    Handle args) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const Agent* found = find<Agent>(r, agent);
  const XferList* from = find<XferList>(r, local);
  const XferList* to = find<XferList>(r, remote);
  const OptArgs* options = find<OptArgs>(r, args);
  if (found == nullptr || from == nullptr || to == nullptr ||
      remoteAgent == nullptr || request == nullptr ||
      (args != nullptr && options == nullptr)) {
    return kInvalidParam;
  }
  const auto refuse = [&](int status) {
    ++r.stats.refusedWrites;
    return status;
  };
  if (operation != kWrite || from->memoryType != kDram ||
      to->memoryType != kDram || from->entries.size() != to->entries.size()) {
    return refuse(kInvalidParam);
  }
  const auto peer = found->remotes.find(remoteAgent);
  if (peer == found->remotes.end()) {
    return refuse(kNotFound);
  }
  for (size_t index = 0; index < from->entries.size(); ++index) {
    if (from->entries[index].length != to->entries[index].length) {
      return refuse(kInvalidParam);
    }
    if (!inside(found->registered, from->entries[index]) ||
        !inside(peer->second, to->entries[index])) {
      return refuse(kNotFound);
    }
  }
  auto made = std::make_unique<Request>();
  made->owner = found->name;
  made->peer = remoteAgent;
  made->from = from->entries;
  made->to = to->entries;
  if (options != nullptr) {
    made->message = options->message;
    made->hasNotif = options->hasNotif;
  }
  *request = add(r, std::move(made));
  return kSuccess;
}

// The notification options were taken when the request was made: `args`
// here is not read.
int postXferRequest(Handle agent, Handle request, Handle /*args*/) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const Agent* found = find<Agent>(r, agent);
  Request* posted = find<Request>(r, request);
  if (found == nullptr || posted == nullptr || posted->owner != found->name) {
    return kInvalidParam;
  }
  const auto peer = r.agents.find(posted->peer);
  if (peer == r.agents.end()) {
    ++r.stats.refusedWrites;
    return kBackend; // the peer exited
  }
  Agent& target = *peer->second;
  // Checked again against what is registered now, not what was described:
  // a lying description must not make the fake write outside live memory.
  for (size_t index = 0; index < posted->from.size(); ++index) {
    if (!inside(found->registered, posted->from[index]) ||
        !inside(target.registered, posted->to[index])) {
      ++r.stats.refusedWrites;
      return kBackend;
    }
  }
  for (size_t index = 0; index < posted->from.size(); ++index) {
    // memmove: two agents may register the same memory.
    std::memmove(
        reinterpret_cast<void*>(posted->to[index].address),
        reinterpret_cast<const void*>(posted->from[index].address),
        posted->from[index].length);
    r.stats.bytesWritten += posted->from[index].length;
  }
  ++r.stats.writes;
  // After the copy, so that whoever sees it sees the data.
  if (posted->hasNotif) {
    target.inbox.emplace_back(found->name, posted->message);
  }
  posted->posted = true;
  return kInProgress;
}

int xferStatus(Handle agent, Handle request) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const Request* found = find<Request>(r, request);
  if (find<Agent>(r, agent) == nullptr || found == nullptr) {
    return kInvalidParam;
  }
  if (!found->posted) {
    return kInvalidState;
  }
  return kSuccess;
}

int releaseXferRequest(Handle agent, Handle request) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (find<Agent>(r, agent) == nullptr ||
      find<Request>(r, request) == nullptr) {
    return kInvalidParam;
  }
  return kSuccess; // nothing is in flight: the copy is done
}

// Notifications.

std::deque<std::string>* fromSender(NotifMap& map, std::string_view sender) {
  for (auto& [name, messages] : map.senders) {
    if (name == sender) {
      return &messages;
    }
  }
  return nullptr;
}

int notifs(Handle agent, Handle map, Handle /*args*/) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Agent* found = find<Agent>(r, agent);
  NotifMap* into = find<NotifMap>(r, map);
  if (found == nullptr || into == nullptr) {
    return kInvalidParam;
  }
  for (auto& [sender, bytes] : found->inbox) {
    std::deque<std::string>* messages = fromSender(*into, sender);
    if (messages == nullptr) {
      messages =
          &into->senders.emplace_back(sender, std::deque<std::string>()).second;
    }
    messages->push_back(std::move(bytes));
  }
  found->inbox.clear();
  return kSuccess;
}

int notifMapSize(Handle map, size_t* size) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const NotifMap* found = find<NotifMap>(r, map);
  if (found == nullptr || size == nullptr) {
    return kInvalidParam;
  }
  *size = found->senders.size();
  return kSuccess;
}

int notifMapAgentAt(Handle map, size_t index, const char** agent) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const NotifMap* found = find<NotifMap>(r, map);
  if (found == nullptr || agent == nullptr || index >= found->senders.size()) {
    return kInvalidParam;
  }
  *agent = found->senders[index].first.c_str();
  return kSuccess;
}

int notifMapCount(Handle map, const char* agent, size_t* count) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  NotifMap* found = find<NotifMap>(r, map);
  if (found == nullptr || agent == nullptr || count == nullptr) {
    return kInvalidParam;
  }
  const std::deque<std::string>* messages = fromSender(*found, agent);
  if (messages == nullptr) {
    return kNotFound;
  }
  *count = messages->size();
  return kSuccess;
}

int notifMapGet(
    Handle map,
    const char* agent,
    size_t index,
    const void** data,
    size_t* length) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  NotifMap* found = find<NotifMap>(r, map);
  if (found == nullptr || agent == nullptr || data == nullptr ||
      length == nullptr) {
    return kInvalidParam;
  }
  const std::deque<std::string>* messages = fromSender(*found, agent);
  if (messages == nullptr) {
    return kNotFound;
  }
  if (index >= messages->size()) {
    return kInvalidParam;
  }
  *data = (*messages)[index].data();
  *length = (*messages)[index].size();
  return kSuccess;
}

int notifMapClear(Handle map) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  NotifMap* found = find<NotifMap>(r, map);
  if (found == nullptr) {
    return kInvalidParam;
  }
  found->senders.clear();
  return kSuccess;
}

int sendNotif(
    Handle agent,
    const char* remoteAgent,
    const void* data,
    size_t length,
    Handle /*args*/) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const Agent* found = find<Agent>(r, agent);
  if (found == nullptr || remoteAgent == nullptr ||
      (data == nullptr && length > 0)) {
    return kInvalidParam;
  }
  if (found->remotes.count(remoteAgent) == 0) {
    return kNotFound; // NIXL sends only to agents it has metadata of
  }
  const auto peer = r.agents.find(remoteAgent);
  if (peer == r.agents.end()) {
    return kBackend; // the peer exited
  }
  peer->second->inbox.emplace_back(found->name, bytesOf(data, length));
  ++r.stats.notifications;
  return kSuccess;
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
