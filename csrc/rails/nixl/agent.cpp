#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/nixl/agent.h"

#include <cstdlib>

#include <c10/util/Exception.h>

#include "rails/peer_text.h"

namespace fairring::rails::nixl {

namespace {

// The plugins NIXL found, for an error message.
std::string pluginsOf(const Api& api, Handle agent) {
  std::string plugins;
  Handle list = nullptr;
  if (api.availablePlugins(agent, &list) != kSuccess) {
    return "none";
  }
  size_t count = 0;
  api.stringListSize(list, &count);
  for (size_t index = 0; index < count; ++index) {
    const char* plugin = nullptr;
    if (api.stringListGet(list, index, &plugin) == kSuccess && plugin) {
      plugins += (plugins.empty() ? "" : ", ") + std::string(plugin);
    }
  }
  api.destroyStringList(list);
  return plugins.empty() ? "none" : plugins;
}

} // namespace

uint64_t deviceIdOf(c10::Device device) {
  return device.is_cuda() ? static_cast<uint64_t>(device.index()) : 0;
}

MemoryType memoryTypeOf(c10::Device device) {
  return device.is_cuda() ? kVram : kDram;
}

Agent::Agent(const Api& api, std::string name, std::string backend, int rank)
    : api_(api),
      name_(std::move(name)),
      backendName_(std::move(backend)),
      rank_(rank) {
  // No progress thread of NIXL's: the mesh's own thread drives UCX when it
  // polls (NIXL's spins without a delay, a core per rank).
  const AgentConfig config{false, false, 0, /*strict*/ 1, 0, 0, 0, false};
  int status = api_.createAgent(name_.c_str(), &config, &agent_);
  TORCH_CHECK(
      status == kSuccess,
      "fairring: NIXL could not create an agent: ",
      statusText(status));
  try {
    Handle params = nullptr;
    TORCH_CHECK(
        api_.createParams(&params) == kSuccess,
        "fairring: NIXL could not make backend parameters");
    status =
        api_.createBackend(agent_, backendName_.c_str(), params, &backend_);
    api_.destroyParams(params);
    if (status != kSuccess) {
      backend_ = nullptr;
      TORCH_CHECK(
          false,
          "fairring: FAIRRING_NIXL_BACKEND=",
          backendName_,
          ", but NIXL could not create that backend on rank ",
          rank_,
          " (",
          statusText(status),
          "; plugins found: ",
          pluginsOf(api_, agent_),
          "). ",
          backendName_ == "LIBFABRIC"
              ? "Its plugin needs libfabric 2.x (libfabric.so.1 with "
                "FABRIC_1.10), hwloc and the GPU driver's libcuda.so.1; "
              : "",
          "choose another with FAIRRING_NIXL_BACKEND=UCX|LIBFABRIC, or use "
          "FAIRRING_RAILS_TRANSPORT=tensorpipe");
    }
    TORCH_CHECK(
        api_.createOptArgs(&args_) == kSuccess,
        "fairring: NIXL could not make arguments");
    TORCH_CHECK(
        api_.optArgsAddBackend(args_, backend_) == kSuccess,
        "fairring: NIXL could not name its backend");
    if (api_.createNotifMap(&notifications_) != kSuccess) {
      notifications_ = nullptr;
    }
  } catch (...) {
    release();
    throw;
  }
}

Agent::~Agent() {
  release();
}

void Agent::release() {
  if (notifications_ != nullptr) {
    api_.destroyNotifMap(std::exchange(notifications_, nullptr));
  }
  for (const auto& peer : std::exchange(peers_, {})) {
    api_.invalidateRemoteMetadata(agent_, peer.c_str());
  }
  if (registered_ != nullptr) {
    api_.deregisterMemory(agent_, registered_, args_);
    api_.destroyRegList(std::exchange(registered_, nullptr));
  }
  if (args_ != nullptr) {
    api_.destroyOptArgs(std::exchange(args_, nullptr));
  }
  // The agent owns the backend; the handle is only a wrapper.
  Handle backend = std::exchange(backend_, nullptr);
  if (agent_ != nullptr) {
    api_.destroyAgent(std::exchange(agent_, nullptr));
  }
  if (backend != nullptr) {
    api_.destroyBackend(backend);
  }
}

void Agent::registerStaging(const Buffer& staging) {
  TORCH_CHECK(
      registered_ == nullptr,
      "fairring: the NIXL rails' staging was registered twice");
  device_ = staging.device;
  Handle list = nullptr;
  TORCH_CHECK(
      api_.createRegList(memoryTypeOf(device_), &list) == kSuccess,
      "fairring: NIXL could not make a registration list");
  int status = api_.regListAdd(
      list,
      reinterpret_cast<uintptr_t>(staging.data),
      staging.bytes,
      deviceIdOf(device_),
      nullptr,
      0);
  if (status == kSuccess) {
    status = api_.registerMemory(agent_, list, args_);
  }
  if (status != kSuccess) {
    api_.destroyRegList(list);
    TORCH_CHECK(
        false,
        "fairring: NIXL (",
        backendName_,
        ") could not register ",
        staging.bytes,
        " bytes of staging on ",
        device_,
        " on rank ",
        rank_,
        ": ",
        statusText(status),
        device_.is_cuda()
            ? "; GPU memory needs a backend built with CUDA support"
            : "");
  }
  registered_ = list;
}

std::string Agent::metadata() {
  void* data = nullptr;
  size_t length = 0;
  const int status = api_.localMetadata(agent_, &data, &length);
  TORCH_CHECK(
      status == kSuccess,
      "fairring: NIXL could not describe this rank's agent: ",
      statusText(status));
  std::string metadata(static_cast<const char*>(data), length);
  std::free(data);
  return metadata;
}

std::string Agent::loadPeer(
    const std::string& metadata, const std::string& expected) {
  char* name = nullptr;
  const int status =
      api_.loadRemoteMetadata(agent_, metadata.data(), metadata.size(), &name);
  if (status != kSuccess) {
    return "NIXL refused it (" + statusText(status) + ")";
  }
  std::string loaded = name ? name : "";
  std::free(name);
  if (loaded != expected) {
    api_.invalidateRemoteMetadata(agent_, loaded.c_str());
    return "it describes agent '" + printable(loaded, 128) +
        "', not the one it names";
  }
  peers_.push_back(std::move(loaded));
  return "";
}

int Agent::notify(const std::string& peer, const std::string& bytes) {
  return api_.sendNotif(
      agent_, peer.c_str(), bytes.data(), bytes.size(), args_);
}

Agent::Transfer::Transfer(Transfer&& other) noexcept
    : api_(other.api_),
      agent_(other.agent_),
      request_(std::exchange(other.request_, nullptr)),
      local_(std::exchange(other.local_, nullptr)),
      remote_(std::exchange(other.remote_, nullptr)) {}

Agent::Transfer& Agent::Transfer::operator=(Transfer&& other) noexcept {
  if (this != &other) {
    release();
    api_ = other.api_;
    agent_ = other.agent_;
    request_ = std::exchange(other.request_, nullptr);
    local_ = std::exchange(other.local_, nullptr);
    remote_ = std::exchange(other.remote_, nullptr);
  }
  return *this;
}

Agent::Transfer::~Transfer() {
  release();
}

void Agent::Transfer::release() {
  // A request NIXL will not release is still in use by it: its handles and
  // lists are left to the agent's teardown rather than freed under it.
  if (request_ != nullptr) {
    if (api_->releaseXferRequest(agent_, request_) != kSuccess) {
      request_ = local_ = remote_ = nullptr;
      return;
    }
    api_->destroyXferRequest(std::exchange(request_, nullptr));
  }
  if (local_ != nullptr) {
    api_->destroyXferList(std::exchange(local_, nullptr));
  }
  if (remote_ != nullptr) {
    api_->destroyXferList(std::exchange(remote_, nullptr));
  }
}

int Agent::write(
    const Buffer& source,
    const Target& target,
    const std::string& notice,
    bool silent,
    Transfer& transfer) {
  Transfer made;
  made.api_ = &api_;
  made.agent_ = agent_;
  Handle args = nullptr;
  const MemoryType type = memoryTypeOf(device_);
  int status = api_.createXferList(type, &made.local_);
  if (status == kSuccess) {
    status = api_.xferListAdd(
        made.local_,
        reinterpret_cast<uintptr_t>(source.data),
        source.bytes,
        deviceIdOf(device_));
  }
  if (status == kSuccess) {
    status = api_.createXferList(type, &made.remote_);
  }
  if (status == kSuccess) {
    status = api_.xferListAdd(
        made.remote_,
        static_cast<uintptr_t>(target.address),
        target.bytes,
        target.deviceId);
  }
  if (status == kSuccess) {
    status = api_.createOptArgs(&args);
  }
  if (status == kSuccess) {
    status = api_.optArgsAddBackend(args, backend_);
  }
  if (status == kSuccess && !silent) {
    status = api_.optArgsSetNotifMessage(args, notice.data(), notice.size());
  }
  if (status == kSuccess) {
    status = api_.optArgsSetHasNotif(args, !silent);
  }
  if (status == kSuccess) {
    status = api_.createXferRequest(
        agent_,
        kWrite,
        made.local_,
        made.remote_,
        target.peer->c_str(),
        &made.request_,
        args);
    if (status != kSuccess) {
      made.request_ = nullptr;
    }
  }
  if (status == kSuccess) {
    status = api_.postXferRequest(agent_, made.request_, args);
  }
  if (args != nullptr) {
    api_.destroyOptArgs(args);
  }
  if (status == kInProgress) {
    transfer = std::move(made);
  }
  return status;
}

int Agent::status(const Transfer& transfer) {
  return api_.xferStatus(agent_, transfer.request_);
}

std::vector<std::pair<std::string, std::string>> Agent::notifications() {
  std::vector<std::pair<std::string, std::string>> received;
  if (notifications_ == nullptr ||
      api_.notifs(agent_, notifications_, nullptr) != kSuccess) {
    return received;
  }
  size_t agents = 0;
  api_.notifMapSize(notifications_, &agents);
  for (size_t index = 0; index < agents; ++index) {
    const char* agent = nullptr;
    size_t count = 0;
    if (api_.notifMapAgentAt(notifications_, index, &agent) != kSuccess ||
        agent == nullptr ||
        api_.notifMapCount(notifications_, agent, &count) != kSuccess) {
      continue;
    }
    for (size_t at = 0; at < count; ++at) {
      const void* data = nullptr;
      size_t length = 0;
      if (api_.notifMapGet(notifications_, agent, at, &data, &length) ==
          kSuccess) {
        received.emplace_back(
            agent, std::string(static_cast<const char*>(data), length));
      }
    }
  }
  api_.notifMapClear(notifications_);
  return received;
}

} // namespace fairring::rails::nixl
