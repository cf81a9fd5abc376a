// The fake NIXL's transfers and notifications (testing/fake_nixl.h): a
// request checked against both sides' registered memory when made and again
// when posted, a posted write copied at once and only then notified, and
// each agent's inbox read into notification maps.

#include "testing/fake_nixl_state.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string_view>

namespace fairring::testing::fake_nixl::state {

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
  return withObject<NotifMap>(
      map, size != nullptr, [&](const NotifMap& found, Registry&) {
        *size = found.senders.size();
        return kSuccess;
      });
}

int notifMapAgentAt(Handle map, size_t index, const char** agent) {
  return withObject<NotifMap>(
      map, agent != nullptr, [&](const NotifMap& found, Registry&) -> int {
        if (index >= found.senders.size()) {
          return kInvalidParam;
        }
        *agent = found.senders[index].first.c_str();
        return kSuccess;
      });
}

int notifMapCount(Handle map, const char* agent, size_t* count) {
  const bool valid = agent != nullptr && count != nullptr;
  return withObject<NotifMap>(
      map, valid, [&](NotifMap& found, Registry&) -> int {
        const std::deque<std::string>* messages = fromSender(found, agent);
        if (messages == nullptr) {
          return kNotFound;
        }
        *count = messages->size();
        return kSuccess;
      });
}

int notifMapGet(
    Handle map,
    const char* agent,
    size_t index,
    const void** data,
    size_t* length) {
  const bool valid = agent != nullptr && data != nullptr && length != nullptr;
  return withObject<NotifMap>(
      map, valid, [&](NotifMap& found, Registry&) -> int {
        const std::deque<std::string>* messages = fromSender(found, agent);
        if (messages == nullptr) {
          return kNotFound;
        }
        if (index >= messages->size()) {
          return kInvalidParam;
        }
        *data = (*messages)[index].data();
        *length = (*messages)[index].size();
        return kSuccess;
      });
}

int notifMapClear(Handle map) {
  return withObject<NotifMap>(map, true, [&](NotifMap& found, Registry&) {
    found.senders.clear();
    return kSuccess;
  });
}

int sendNotif(
    Handle agent,
    const char* remoteAgent,
    const void* data,
    size_t length,
    Handle /*args*/) {
  const bool valid = remoteAgent != nullptr && (data != nullptr || length == 0);
  return withObject<Agent>(
      agent, valid, [&](const Agent& found, Registry& r) -> int {
        if (found.remotes.count(remoteAgent) == 0) {
          return kNotFound; // NIXL sends only to agents it has metadata of
        }
        const auto peer = r.agents.find(remoteAgent);
        if (peer == r.agents.end()) {
          return kBackend; // the peer exited
        }
        peer->second->inbox.emplace_back(found.name, bytesOf(data, length));
        ++r.stats.notifications;
        return kSuccess;
      });
}

} // namespace fairring::testing::fake_nixl::state
