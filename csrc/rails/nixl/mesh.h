#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "config.h"
#include "rails/nixl/library.h"
#include "rails/nixl/wire.h"
#include "rails/mesh_site.h"
#include "rails/transport.h"
#include "topology.h"

namespace fairring::rails::nixl {

class NixlConnection;

// The rails mesh over NIXL: one-sided writes straight into the receiver's
// staging, with notifications (docs/design.md, "NIXL rails").
//
// Each rank has one NIXL agent with one backend (UCX or LIBFABRIC) and
// registers its engine's staging with it once (registerStaging). Neighbours
// (rail peers, and the other ranks of this machine for control) exchange
// agent metadata and where their staging lies through the group's store.
//
// A data connection moves a message only into memory its receiver granted:
// read() sends the sender a grant for exactly that message (its tag, length
// and target, which lies in the receiver's leased staging), and the sender
// writes it there, or says it has another message and writes nothing. So no
// write lands in memory the receiver is not holding for it, whatever the
// timing. Control notes, grants and close notices travel as notifications.
//
// Peers are not trusted: metadata must name the agent its rank published,
// every notification is parsed and checked (wire.h) and must come from a
// neighbour's agent, a grant must lie in the peer's staging. Others are
// refused and counted (describe()).
//
// One thread, the mesh's, makes every NIXL call after registerStaging and
// runs every callback; shutdown() (and the destructor) joins it.
class NixlMesh final : public Mesh {
 public:
  explicit NixlMesh(const MeshSite& site);
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

  using Callback = std::function<void()>;

  struct Peer {
    int rank = -1;
    std::string agent;
    uint64_t stagingBase = 0;
    uint64_t stagingBytes = 0;
    uint64_t deviceId = 0;
  };
  struct Read {
    uint64_t seq;
    std::string tag;
    Buffer target;
    Connection::Received received;
  };
  struct Write {
    std::string tag;
    Buffer buffer;
    Connection::Done done;
    // Recorded on the buffer's stream: the bytes are ready once it completes.
    std::shared_ptr<c10::Event> ready;
    bool strayed = false; // the ungranted-writes knob wrote it once already
  };
  struct Grant {
    uint64_t address;
    uint64_t bytes;
    std::string tag;
  };
  // One (rail peer, lane) data connection's state, both directions.
  struct DataLink {
    uint64_t nextGrant = 0;
    std::optional<Read> read;
    std::deque<Write> writes;
    uint64_t nextWrite = 0;
    std::map<uint64_t, Grant> grants; // by seq
    std::string closed; // why, once closed
    std::optional<Grant> lastGrant; // for the ungranted-writes test knob
  };
  // One neighbour's control connection's state.
  struct ControlLink {
    uint64_t nextOut = 0;
    uint64_t nextIn = 0;
    std::map<uint64_t, std::string> early; // notes ahead of nextIn
    std::deque<std::string> arrived;
    std::deque<Connection::Note> readers;
    std::string broken; // why, once the neighbour misbehaved
  };
  // Work for the mesh's thread: a notification, or a write to post.
  struct Notify {
    size_t neighbour;
    std::string bytes;
    Connection::Done done; // may be empty
  };
  struct Post {
    int machine;
    Lane lane;
    Write write;
    Grant grant;
    uint64_t seq;
    bool silent = false; // no notification: only the ungranted-writes knob's
  };
  using Outgoing = std::variant<Notify, Post>;
  struct Transfer {
    Handle request = nullptr;
    Handle local = nullptr;
    Handle remote = nullptr;
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

  // Under mutex_: pairs queued writes with grants; callbacks to run go to
  // `later`.
  void matchLocked(int machine, Lane lane, std::vector<Callback>& later);
  void closeLinkLocked(
      DataLink& link, const std::string& why, std::vector<Callback>& later);
  void deliverNotesLocked(ControlLink& link, std::vector<Callback>& later);
  void queueLocked(Outgoing outgoing);
  // A neighbour sent something it must not: its data connections close and
  // its control connection fails.
  void misbehavedLocked(
      size_t neighbour, const std::string& why, std::vector<Callback>& later);
  // A neighbour is gone (`why`): its data connections close and its control
  // connection fails, now and for later calls.
  void lostLocked(
      size_t neighbour, const std::string& why, std::vector<Callback>& later);
  size_t neighbourOfMachine(int machine) const;
  int machineOfNeighbour(size_t neighbour) const;
  bool isRailPeer(size_t neighbour) const;
  DataLink& linkLocked(int machine, Lane lane);
  bool waitingForPeersLocked() const;
  void releaseNixl();

  void progressLoop();
  // The mesh's thread: true if it did anything.
  bool sendOutgoing();
  bool pollTransfers();
  bool pollNotifications(Handle map);
  bool releaseHeldBack();
  void onNotification(
      const std::string& agent,
      std::string bytes,
      std::vector<Callback>& later);
  void startTransfer(Post post);
  std::string checkBuffer(const Buffer& buffer, const char* what) const;
  std::string describePeer(size_t neighbour) const;

  const Topology topology_;
  const c10::Device device_;
  const std::chrono::milliseconds timeout_;
  const c10::intrusive_ptr<c10d::Store> store_;
  const std::string storePrefix_;
  const std::string backendName_;
  const std::string interfaceName_;
  const Api& api_;
  std::string name_; // this rank's agent
  Handle agent_ = nullptr;
  Handle backend_ = nullptr;
  Handle args_ = nullptr; // names the backend
  Handle registered_ = nullptr; // the staging's registration
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

  // Test knobs (FAIRRING_TEST_NIXL_*), read once. A slow receiver holds
  // each arrived message this long before its reader learns of it (so before
  // it grants the next); "ungranted" writes each queued message at once into
  // the previous message's grant, with no notice, as a sender without flow
  // control would: the negative control of the flow-control test.
  std::chrono::milliseconds slowReceiver_{0};
  bool ungrantedWrites_ = false;
  // Arrivals the slow receiver holds back, due at their time; guarded by
  // mutex_.
  std::deque<std::pair<std::chrono::steady_clock::time_point, Callback>>
      heldBack_;

  std::vector<Transfer> transfers_; // the mesh's thread's only
  std::deque<Post> waiting_; // writes whose bytes are not ready; likewise
  std::thread thread_;
};

} // namespace fairring::rails::nixl
