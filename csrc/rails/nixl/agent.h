#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

#include "rails/nixl/library.h"
#include "rails/transport.h"

namespace fairring::rails::nixl {

// One rank's NIXL agent with its one backend, its registered staging and the
// peers whose metadata it loaded: the owner of every NIXL handle of a mesh,
// released in the destructor. It keeps no state of the protocol, and it is
// not thread-safe: after registration, only the mesh's thread calls it.
class Agent {
 public:
  // Creates the agent named `name` and its backend (UCX or LIBFABRIC);
  // throws, saying what to change, where NIXL cannot.
  Agent(const Api& api, std::string name, std::string backend, int rank);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  const std::string& name() const {
    return name_;
  }
  const std::string& backend() const {
    return backendName_;
  }
  bool registered() const {
    return registered_ != nullptr;
  }

  // Registers `staging` (once); throws, naming the rank and device, where
  // the backend cannot.
  void registerStaging(const Buffer& staging);
  // NIXL's own description of this agent, for its peers to load.
  std::string metadata();
  // Loads a peer's metadata, which must describe agent `expected`: "" or why
  // it was refused.
  std::string loadPeer(
      const std::string& metadata, const std::string& expected);

  // A notification to `peer`: its status.
  int notify(const std::string& peer, const std::string& bytes);

  // A posted write of local memory into a peer's, until it is released.
  class Transfer {
   public:
    Transfer() = default;
    Transfer(Transfer&& other) noexcept;
    Transfer& operator=(Transfer&& other) noexcept;
    ~Transfer();
    explicit operator bool() const {
      return request_ != nullptr;
    }

   private:
    friend class Agent;
    const Api* api_ = nullptr;
    Handle agent_ = nullptr;
    Handle request_ = nullptr;
    Handle local_ = nullptr;
    Handle remote_ = nullptr;
    void release();
  };
  struct Target {
    const std::string* peer;
    uint64_t address;
    uint64_t bytes;
    uint64_t deviceId;
  };
  // Writes `source` into `target`, with `notice` as the notification NIXL
  // delivers after the bytes (none if `silent`). Its status: kInProgress
  // with `transfer` set, or done (kSuccess, or an error).
  int write(
      const Buffer& source,
      const Target& target,
      const std::string& notice,
      bool silent,
      Transfer& transfer);
  // kInProgress, kSuccess or an error.
  int status(const Transfer& transfer);

  // Every notification since the last call: (sender's agent name, bytes).
  std::vector<std::pair<std::string, std::string>> notifications();

 private:
  void release();

  const Api& api_;
  const std::string name_;
  const std::string backendName_;
  const int rank_;
  Handle agent_ = nullptr;
  Handle backend_ = nullptr;
  Handle args_ = nullptr; // names the backend
  Handle registered_ = nullptr; // the staging's registration
  Handle notifications_ = nullptr; // NIXL's map, reused by every poll
  std::vector<std::string> peers_; // whose metadata was loaded
  c10::Device device_{c10::kCPU}; // the staging's
};

// NIXL's memory type and device id for buffers on `device`.
MemoryType memoryTypeOf(c10::Device device);
uint64_t deviceIdOf(c10::Device device);

} // namespace fairring::rails::nixl
