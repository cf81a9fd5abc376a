#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "rails/mesh_site.h"
#include "rails/nixl/agent.h"
#include "rails/nixl/control_link.h"
#include "rails/nixl/data_link.h"
#include "rails/nixl/library.h"
#include "rails/nixl/peers.h"
#include "rails/transport.h"
#include "topology.h"

namespace fairring::rails::nixl {

class NixlConnection;

// Knobs for tests of the NIXL rails (FAIRRING_TEST_NIXL_*), read once, by
// the factory. A slow receiver holds each arrived message this long before
// its reader learns of it (so before it grants the next); "ungranted" writes
// each queued message at once into the previous message's grant, with no
// notice, as a sender without flow control would: the negative control of
// the flow-control test.
// Callbacks gathered under the mesh's lock, run after it is released.
inline void runAll(std::vector<Callback>& callbacks) {
  for (auto& callback : callbacks) {
    callback();
  }
}

struct TestKnobs {
  std::chrono::milliseconds slowReceiver{0};
  bool ungrantedWrites = false;

  static TestKnobs fromEnvironment();
};

// The rails mesh over NIXL: one-sided writes straight into the receiver's
// staging, with notifications (docs/design.md, "NIXL rails").
//
// Each rank has one NIXL agent (agent.h) and registers its engine's staging
// with it once (registerStaging). Neighbours (rail peers, and the other
// ranks of this machine for control) exchange where their staging lies and
// NIXL's metadata through the group's store (peers.h).
//
// A data connection moves a message only into memory its receiver granted
// (data_link.h); control notes are ordered by their sender's numbers
// (control_link.h). Grants, notices, notes and close notices travel as
// notifications (wire.h).
//
// Peers are not trusted: a record must pass peers.h's checks, every
// notification is parsed (wire.h) and must come from a neighbour's agent, a
// grant must lie in the peer's staging, and a peer that breaks the protocol
// loses its connections. Refusals are counted (describe()).
//
// Threads: callers issue reads, writes and notes from any thread, under
// mutex_, which guards every link. One thread, the mesh's, started by
// registerStaging, makes every NIXL call after that and runs every callback;
// shutdown() (and the destructor) joins it, then releases the agent.
class NixlMesh final : public Mesh {
 public:
  NixlMesh(const MeshSite& site, const Api& api, TestKnobs knobs);
  ~NixlMesh() override;

  int machine() const override {
    return topology_.machine();
  }
  int numMachines() const override {
    return topology_.numMachines();
  }
  int peerRank(int machine) const override {
    return topology_.railPeers()[machine];
  }
  Connection& connection(int machine, Lane lane) override;
  const std::vector<int>& neighbours() const override {
    return neighbours_;
  }
  Connection& control(size_t index) override;
  void registerStaging(const Buffer& staging) override;
  void close() override;
  void shutdown() override;
  std::string describe() const override;
  std::string downInterface() const override;

 private:
  friend class NixlConnection;

  // Work for the mesh's thread: a notification, or a write to post.
  struct Notify {
    size_t neighbour;
    std::string bytes;
    Connection::Done done; // may be empty
  };
  struct Post {
    int machine;
    Lane lane;
    StartWrite start;
  };
  using Outgoing = std::variant<Notify, Post>;
  struct InFlight {
    Agent::Transfer transfer;
    Connection::Done done;
  };

  // Called by connections, from any thread.
  void read(
      int machine,
      Lane lane,
      std::string tag,
      const Buffer& target,
      Connection::Received received);
  void write(
      int machine,
      Lane lane,
      std::string tag,
      const Buffer& buffer,
      Connection::Done done);
  void writeNote(size_t neighbour, std::string text, Connection::Done done);
  void readNote(size_t neighbour, Connection::Note note);

  // Under mutex_; callbacks to run go to `later`.
  // Queues what a link asked for, with the test knobs' extra writes.
  void applyLocked(
      int machine,
      Lane lane,
      LinkEffects& effects,
      std::vector<Callback>& later);
  // A read's completion, held back by the slow-receiver knob.
  void arrivedLocked(Callback arrival, std::vector<Callback>& later);
  void closeLinkLocked(
      int machine,
      Lane lane,
      const std::string& why,
      std::vector<Callback>& later);
  // A neighbour sent something it must not: counted, then lost.
  void misbehavedLocked(
      size_t neighbour, const std::string& why, std::vector<Callback>& later);
  // A neighbour is gone (`why`): its data connections close and its control
  // connection fails, now and for later calls.
  void lostLocked(
      size_t neighbour, const std::string& why, std::vector<Callback>& later);
  void onNotification(
      const std::string& agent,
      const std::string& bytes,
      std::vector<Callback>& later);
  void queueLocked(Outgoing outgoing);
  bool waitingForPeersLocked() const;
  DataLink& linkLocked(int machine, Lane lane);

  size_t neighbourOfMachine(int machine) const;
  int machineOfNeighbour(size_t neighbour) const;
  bool isRailPeer(size_t neighbour) const;
  std::string checkBuffer(const Buffer& buffer, const char* what) const;
  std::string describePeer(size_t neighbour) const;

  // The mesh's thread: each returns true if it did anything.
  void progressLoop();
  bool sendOutgoing();
  void startTransfer(Post post);
  bool pollTransfers();
  bool pollNotifications();
  bool releaseHeldBack();

  const Topology topology_;
  const c10::Device device_;
  const std::chrono::milliseconds timeout_;
  const c10::intrusive_ptr<c10d::Store> store_;
  const std::string storePrefix_;
  const std::string key_; // the group's rails key: seals the staging records
  const std::string backendName_;
  const std::string interfaceName_;
  const TestKnobs knobs_;
  const std::string name_; // this rank's agent
  std::unique_ptr<Agent> agent_; // released by shutdown()
  Buffer staging_;

  std::vector<int> neighbours_;
  std::vector<Peer> peers_; // by neighbour index; filled by registerStaging
  std::unordered_map<std::string, size_t> byAgent_;
  std::vector<std::unique_ptr<NixlConnection>>
      connections_; // machine * kLanes + lane
  std::vector<std::unique_ptr<NixlConnection>> controls_; // by neighbour

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false; // guarded by mutex_
  bool closed_ = false; // guarded by mutex_
  std::vector<DataLink> links_; // machine * kLanes + lane; guarded by mutex_
  std::vector<ControlLink> controlLinks_; // by neighbour; guarded by mutex_
  std::deque<Outgoing> outbox_; // guarded by mutex_
  uint64_t refused_ = 0; // notifications refused; guarded by mutex_
  std::string firstRefusal_; // guarded by mutex_
  // Writes queued before their grant had come: flow control at work.
  uint64_t writesWaited_ = 0; // guarded by mutex_
  // Arrivals the slow-receiver knob holds back, due at their time; guarded
  // by mutex_.
  std::deque<std::pair<std::chrono::steady_clock::time_point, Callback>>
      heldBack_;

  std::vector<InFlight> transfers_; // the mesh's thread's only
  std::deque<Post> waiting_; // writes whose bytes are not ready; likewise
  std::thread thread_;
};

} // namespace fairring::rails::nixl
