#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/nixl/mesh.h"
#include "rails/nixl/factory.h"

#include <cctype>
#include <cstdlib>
#include <random>
#include <sstream>

#include <c10/util/Exception.h>

#include "rails/interfaces.h"

namespace fairring::rails::nixl {

namespace {

// At most this many grants or notes a peer may send ahead of what is due.
constexpr size_t kMaxAhead = 1024;
// How long the mesh's thread sleeps between polls: while it waits for peers,
// and while it has nothing to wait for (control notes only).
constexpr auto kBusyPoll = std::chrono::microseconds(20);
constexpr auto kIdlePoll = std::chrono::milliseconds(1);
// How long shutdown lets posted writes finish before releasing them.
constexpr auto kDrain = std::chrono::seconds(2);

std::string randomHex() {
  std::random_device device;
  std::ostringstream out;
  out << std::hex << (static_cast<uint64_t>(device()) << 32 | device());
  return out.str();
}

MemoryType memoryTypeOf(c10::Device device) {
  return device.is_cuda() ? kVram : kDram;
}

uint64_t deviceIdOf(c10::Device device) {
  return device.is_cuda() ? static_cast<uint64_t>(device.index()) : 0;
}

uint64_t addressOf(const void* data) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data));
}

// Callbacks gathered under the mesh's lock, run after it is released.
void runAll(std::vector<std::function<void()>>& callbacks) {
  for (auto& callback : callbacks) {
    callback();
  }
}

bool plausibleAgentName(std::string_view name) {
  if (name.empty() || name.size() > 128 || name.substr(0, 9) != "fairring-") {
    return false;
  }
  for (const char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-')) {
      return false;
    }
  }
  return true;
}

} // namespace

class NixlConnection final : public Connection {
 public:
  NixlConnection(NixlMesh& mesh, int machine, Lane lane)
      : mesh_(mesh), machine_(machine), lane_(lane) {}
  NixlConnection(NixlMesh& mesh, size_t neighbour)
      : mesh_(mesh), neighbour_(neighbour) {}

  void write(std::string tag, const Buffer& buffer, Done done) override {
    if (machine_ < 0) {
      done("data was sent on a control connection");
      return;
    }
    mesh_.write(machine_, lane_, std::move(tag), buffer, std::move(done));
  }
  void read(std::string tag, const Buffer& target, Received received) override {
    if (machine_ < 0) {
      received("data was read on a control connection", "", 0);
      return;
    }
    mesh_.read(machine_, lane_, std::move(tag), target, std::move(received));
  }
  void writeNote(std::string text, Done done) override {
    if (machine_ >= 0) {
      done("a note was sent on a data connection");
      return;
    }
    mesh_.writeNote(neighbour_, std::move(text), std::move(done));
  }
  void readNote(Note note) override {
    if (machine_ >= 0) {
      note("a note was read on a data connection", "");
      return;
    }
    mesh_.readNote(neighbour_, std::move(note));
  }

 private:
  NixlMesh& mesh_;
  const int machine_ = -1; // data connections
  const Lane lane_ = kShards;
  const size_t neighbour_ = 0; // control connections
};

NixlMesh::NixlMesh(const MeshSite& site)
    : topology_(site.topology),
      device_(site.device),
      timeout_(site.timeout),
      store_(site.store),
      storePrefix_(site.storePrefix + "nixl/"),
      backendName_(site.network.nixlBackend),
      interfaceName_(site.network.interfaceName),
      api_(load(site.network.nixlLibrary)) {
  TORCH_CHECK(
      site.device.is_cpu() ||
          (site.device.is_cuda() && site.device.has_index()),
      "fairring: the NIXL rails carry CPU or indexed CUDA buffers, not ",
      site.device);
  const int rank = topology_.rank();
  neighbours_ = topology_.neighbours();
  links_.resize(static_cast<size_t>(numMachines()) * kLanes);
  controlLinks_.resize(neighbours_.size());
  connections_.resize(links_.size());
  for (int machine = 0; machine < numMachines(); ++machine) {
    if (machine == topology_.machine()) {
      continue;
    }
    for (int lane = 0; lane < kLanes; ++lane) {
      connections_[machine * kLanes + lane] = std::make_unique<NixlConnection>(
          *this, machine, static_cast<Lane>(lane));
    }
  }
  for (size_t index = 0; index < neighbours_.size(); ++index) {
    controls_.push_back(std::make_unique<NixlConnection>(*this, index));
  }

  if (const char* slow = std::getenv("FAIRRING_TEST_NIXL_SLOW_RECEIVER_MS")) {
    slowReceiver_ = std::chrono::milliseconds(std::atoi(slow));
  }
  if (const char* ungranted =
          std::getenv("FAIRRING_TEST_NIXL_UNGRANTED_WRITES")) {
    ungrantedWrites_ = std::string(ungranted) == "1";
  }
  name_ = "fairring-rank" + std::to_string(rank) + "-" + randomHex();
  try {
    // No progress thread of NIXL's: the mesh's own thread drives UCX when
    // it polls (NIXL's spins without a delay, a core per rank).
    const AgentConfig config{false, false, 0, /*strict*/ 1, 0, 0, 0, false};
    int status = api_.createAgent(name_.c_str(), &config, &agent_);
    TORCH_CHECK(
        status == kSuccess,
        "fairring: NIXL could not create an agent: ",
        statusText(status));
    std::string plugins;
    Handle list = nullptr;
    if (api_.availablePlugins(agent_, &list) == kSuccess) {
      size_t count = 0;
      api_.stringListSize(list, &count);
      for (size_t index = 0; index < count; ++index) {
        const char* plugin = nullptr;
        if (api_.stringListGet(list, index, &plugin) == kSuccess && plugin) {
          plugins += (plugins.empty() ? "" : ", ") + std::string(plugin);
        }
      }
      api_.destroyStringList(list);
    }
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
          rank,
          " (",
          statusText(status),
          "; plugins found: ",
          plugins.empty() ? "none" : plugins,
          "). ",
          backendName_ == "LIBFABRIC"
              ? "Its plugin needs libfabric 2.x (libfabric.so.1 with "
                "FABRIC_1.10), "
                "hwloc and the GPU driver's libcuda.so.1; "
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
  } catch (...) {
    releaseNixl();
    throw;
  }
}

NixlMesh::~NixlMesh() {
  shutdown();
}

void NixlMesh::releaseNixl() {
  for (const auto& peer : peers_) {
    if (agent_ != nullptr && !peer.agent.empty()) {
      api_.invalidateRemoteMetadata(agent_, peer.agent.c_str());
    }
  }
  peers_.clear();
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

// Rail peers come first among the neighbours, by machine, this rank's own
// machine left out (Topology::neighbours).
size_t NixlMesh::neighbourOfMachine(int machine) const {
  return static_cast<size_t>(
      machine < topology_.machine() ? machine : machine - 1);
}

int NixlMesh::machineOfNeighbour(size_t neighbour) const {
  const int index = static_cast<int>(neighbour);
  return index < topology_.machine() ? index : index + 1;
}

bool NixlMesh::isRailPeer(size_t neighbour) const {
  return neighbour + 1 < static_cast<size_t>(numMachines());
}

NixlMesh::DataLink& NixlMesh::linkLocked(int machine, Lane lane) {
  return links_[static_cast<size_t>(machine) * kLanes + lane];
}

std::string NixlMesh::describePeer(size_t neighbour) const {
  return std::string(isRailPeer(neighbour) ? "rail peer" : "rank") + " " +
      std::to_string(neighbours_[neighbour]);
}

void NixlMesh::registerStaging(const Buffer& staging) {
  TORCH_CHECK(
      registered_ == nullptr,
      "fairring: the NIXL rails' staging was registered twice");
  TORCH_CHECK(
      staging.data != nullptr && staging.bytes > 0 && staging.device == device_,
      "fairring: the NIXL rails need staging on ",
      device_);
  staging_ = staging;
  const MemoryType type = memoryTypeOf(device_);
  Handle list = nullptr;
  TORCH_CHECK(
      api_.createRegList(type, &list) == kSuccess,
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
        topology_.rank(),
        ": ",
        statusText(status),
        device_.is_cuda()
            ? "; GPU memory needs a backend built with CUDA support"
            : "");
  }
  registered_ = list;

  void* data = nullptr;
  size_t length = 0;
  status = api_.localMetadata(agent_, &data, &length);
  TORCH_CHECK(
      status == kSuccess,
      "fairring: NIXL could not describe this rank's agent: ",
      statusText(status));
  StagingRecord own;
  own.rank = static_cast<uint64_t>(topology_.rank());
  own.agent = name_;
  own.memoryType = static_cast<uint64_t>(type);
  own.deviceId = deviceIdOf(device_);
  own.address = addressOf(staging.data);
  own.bytes = staging.bytes;
  own.agentMetadata.assign(static_cast<const char*>(data), length);
  std::free(data);
  const std::string published = encode(own);
  store_->set(
      storePrefix_ + std::to_string(topology_.rank()),
      std::vector<uint8_t>(published.begin(), published.end()));

  // Every neighbour's, in one store round trip once all are published, and
  // checked before NIXL sees it.
  std::vector<std::string> keys;
  for (const int peer : neighbours_) {
    keys.push_back(storePrefix_ + std::to_string(peer));
  }
  try {
    if (!keys.empty()) {
      store_->wait(keys, timeout_);
    }
  } catch (const std::exception&) {
    std::string missing;
    for (size_t index = 0; index < keys.size(); ++index) {
      if (!store_->check({keys[index]})) {
        missing +=
            (missing.empty() ? "" : ", ") + std::to_string(neighbours_[index]);
      }
    }
    TORCH_CHECK(
        false,
        "fairring: timed out after ",
        timeout_.count(),
        " ms on rank ",
        topology_.rank(),
        " waiting for the NIXL agent metadata of ranks ",
        missing.empty() ? std::string("(all arrived at the end)") : missing,
        " (store keys ",
        storePrefix_,
        "<rank>): they have not made their engine. Check that every rank "
        "issued the same all-reduce, with FAIRRING_RAILS_TRANSPORT=nixl");
  }
  const auto values = keys.empty() ? std::vector<std::vector<uint8_t>>{}
                                   : store_->multiGet(keys);
  peers_.resize(neighbours_.size());
  for (size_t index = 0; index < neighbours_.size(); ++index) {
    const int peer = neighbours_[index];
    const std::string& key = keys[index];
    const std::string text(values[index].begin(), values[index].end());
    std::string why;
    const auto record = parseStagingRecord(text, why);
    if (!record) {
      // `why` says what is wrong with it.
    } else if (record->rank != static_cast<uint64_t>(peer)) {
      why = "it names another rank";
    } else if (!plausibleAgentName(record->agent)) {
      why = "its agent name is not one fairring makes";
    } else if (record->memoryType != static_cast<uint64_t>(type)) {
      why = "its staging is on another device type";
    }
    Peer found;
    if (why.empty()) {
      found = Peer{
          peer,
          record->agent,
          record->address,
          record->bytes,
          record->deviceId};
      char* name = nullptr;
      const int loadStatus = api_.loadRemoteMetadata(
          agent_,
          record->agentMetadata.data(),
          record->agentMetadata.size(),
          &name);
      if (loadStatus != kSuccess) {
        why = "NIXL refused it (" + statusText(loadStatus) + ")";
      } else {
        const std::string loadedName = name ? name : "";
        std::free(name);
        if (loadedName != found.agent) {
          api_.invalidateRemoteMetadata(agent_, loadedName.c_str());
          why = "it describes agent '" + printable(loadedName, 128) +
              "', not the one it names";
        }
      }
    }
    TORCH_CHECK(
        why.empty(),
        "fairring: the NIXL agent metadata rank ",
        peer,
        " published (store key ",
        key,
        ") was refused on rank ",
        topology_.rank(),
        ": ",
        why,
        ". Check that every rank runs the same fairring and NIXL, with "
        "FAIRRING_RAILS_TRANSPORT=nixl, and that nothing else writes to the "
        "group's store");
    peers_[index] = std::move(found);
    byAgent_[peers_[index].agent] = index;
  }
  thread_ = std::thread([this] { progressLoop(); });
}

std::string NixlMesh::checkBuffer(
    const Buffer& buffer, const char* what) const {
  const auto begin = reinterpret_cast<uintptr_t>(staging_.data);
  const auto data = reinterpret_cast<uintptr_t>(buffer.data);
  if (registered_ == nullptr) {
    return "the NIXL rails moved data before their staging was registered";
  }
  if (buffer.device != device_ || data < begin ||
      buffer.bytes > staging_.bytes ||
      data - begin > staging_.bytes - buffer.bytes) {
    return std::string("the NIXL rails carry only the engine's staging, but ") +
        what +
        " lies elsewhere (FAIRRING_TEST_EMULATED_DEVICE needs "
        "FAIRRING_RAILS_TRANSPORT=tensorpipe)";
  }
  return "";
}

void NixlMesh::queueLocked(Outgoing outgoing) {
  outbox_.push_back(std::move(outgoing));
  wake_.notify_all();
}

void NixlMesh::read(
    int machine,
    Lane lane,
    std::string tag,
    const Buffer& target,
    Connection::Received received) {
  std::vector<Callback> later;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DataLink& link = linkLocked(machine, lane);
    std::string error = !link.closed.empty()
        ? link.closed
        : checkBuffer(target, "a receive's target");
    if (error.empty() && link.read) {
      error = "a read was posted while another was pending";
    }
    if (error.empty() && tag.size() > kMaxTagBytes) {
      error = "a tag of " + std::to_string(tag.size()) + " bytes";
    }
    if (!error.empty()) {
      later.push_back(
          [received = std::move(received), error] { received(error, "", 0); });
    } else {
      const uint64_t seq = link.nextGrant++;
      Message grant{
          Kind::kGrant, lane, seq, addressOf(target.data), target.bytes, tag};
      link.read = Read{seq, std::move(tag), target, std::move(received)};
      queueLocked(
          Notify{
              neighbourOfMachine(machine),
              encode(grant),
              [this, machine, lane](const std::string& error) {
                if (error.empty()) {
                  return;
                }
                std::vector<Callback> failed;
                {
                  std::lock_guard<std::mutex> lock(mutex_);
                  closeLinkLocked(linkLocked(machine, lane), error, failed);
                }
                runAll(failed);
              }});
    }
  }
  runAll(later);
}

void NixlMesh::write(
    int machine,
    Lane lane,
    std::string tag,
    const Buffer& buffer,
    Connection::Done done) {
  std::vector<Callback> later;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DataLink& link = linkLocked(machine, lane);
    const std::string error = !link.closed.empty()
        ? link.closed
        : checkBuffer(buffer, "a send's buffer");
    if (!error.empty()) {
      later.push_back([done = std::move(done), error] { done(error); });
    } else {
      Write queued{std::move(tag), buffer, std::move(done), nullptr};
      if (buffer.stream) {
        // NIXL reads the bytes off the stream's order: it waits for them.
        queued.ready =
            std::make_shared<c10::Event>(buffer.stream->device_type());
        queued.ready->record(*buffer.stream);
      }
      link.writes.push_back(std::move(queued));
      matchLocked(machine, lane, later);
      writesWaited_ += link.writes.empty() ? 0 : 1;
    }
  }
  runAll(later);
}

void NixlMesh::matchLocked(
    int machine, Lane lane, std::vector<Callback>& later) {
  DataLink& link = linkLocked(machine, lane);
  const size_t neighbour = neighbourOfMachine(machine);
  const Peer& peer = peers_[neighbour];
  while (!link.writes.empty() && link.closed.empty()) {
    const auto found = link.grants.find(link.nextWrite);
    if (found == link.grants.end()) {
      if (ungrantedWrites_ && link.lastGrant && link.lastGrant->bytes > 0 &&
          !link.writes.front().strayed &&
          link.lastGrant->bytes == link.writes.front().buffer.bytes) {
        // The negative control: overwrite what the last grant named, which
        // the receiver may still be using; the write proper follows its grant.
        Write stray = link.writes.front();
        link.writes.front().strayed = true;
        stray.done = [](const std::string&) {};
        // No notice: the receiver cannot tell.
        queueLocked(
            Post{
                machine,
                lane,
                std::move(stray),
                *link.lastGrant,
                link.nextWrite,
                /*silent=*/true});
      }
      return;
    }
    const Grant grant = std::move(found->second);
    link.grants.erase(found);
    link.lastGrant = grant;
    const uint64_t seq = link.nextWrite++;
    if (grant.address < peer.stagingBase || grant.bytes > peer.stagingBytes ||
        grant.address - peer.stagingBase > peer.stagingBytes - grant.bytes) {
      misbehavedLocked(
          neighbour, "it granted memory outside its staging", later);
      return;
    }
    Write write = std::move(link.writes.front());
    link.writes.pop_front();
    if (grant.tag != write.tag || grant.bytes != write.buffer.bytes) {
      // Another message than the receiver expects: nothing is written, and
      // the receiver fails the protocol naming both.
      queueLocked(
          Notify{
              neighbour,
              encode(
                  Message{
                      Kind::kHeader,
                      lane,
                      seq,
                      0,
                      write.buffer.bytes,
                      write.tag}),
              std::move(write.done)});
    } else {
      queueLocked(
          Post{machine, lane, std::move(write), grant, seq, /*silent=*/false});
    }
  }
}

void NixlMesh::closeLinkLocked(
    DataLink& link, const std::string& why, std::vector<Callback>& later) {
  if (!link.closed.empty()) {
    return;
  }
  link.closed = why;
  if (link.read) {
    later.push_back([received = std::move(link.read->received), why] {
      received(why, "", 0);
    });
    link.read.reset();
  }
  for (auto& write : link.writes) {
    later.push_back([done = std::move(write.done), why] { done(why); });
  }
  link.writes.clear();
  link.grants.clear();
}

void NixlMesh::misbehavedLocked(
    size_t neighbour, const std::string& why, std::vector<Callback>& later) {
  const std::string text =
      describePeer(neighbour) + " sent what the NIXL rails refuse: " + why;
  ++refused_;
  if (firstRefusal_.empty()) {
    firstRefusal_ = text;
  }
  lostLocked(neighbour, text, later);
}

void NixlMesh::lostLocked(
    size_t neighbour, const std::string& text, std::vector<Callback>& later) {
  if (isRailPeer(neighbour)) {
    const int machine = machineOfNeighbour(neighbour);
    for (int lane = 0; lane < kLanes; ++lane) {
      closeLinkLocked(
          linkLocked(machine, static_cast<Lane>(lane)), text, later);
    }
  }
  ControlLink& control = controlLinks_[neighbour];
  if (control.broken.empty()) {
    control.broken = text;
  }
  for (auto& reader : control.readers) {
    later.push_back([reader = std::move(reader), text] { reader(text, ""); });
  }
  control.readers.clear();
}

void NixlMesh::writeNote(
    size_t neighbour, std::string text, Connection::Done done) {
  if (text.size() > kMaxNoteBytes) {
    done("a note of " + std::to_string(text.size()) + " bytes");
    return;
  }
  std::string broken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ControlLink& link = controlLinks_.at(neighbour);
    broken = link.broken;
    if (broken.empty()) {
      const uint64_t seq = link.nextOut++;
      queueLocked(
          Notify{
              neighbour,
              encode(Message{Kind::kNote, 0, seq, 0, 0, std::move(text)}),
              std::move(done)});
      return;
    }
  }
  done(broken);
}

void NixlMesh::readNote(size_t neighbour, Connection::Note note) {
  std::vector<Callback> later;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ControlLink& link = controlLinks_.at(neighbour);
    if (!link.broken.empty() || stopping_) {
      const std::string why =
          link.broken.empty() ? "the rails shut down" : link.broken;
      later.push_back([note = std::move(note), why] { note(why, ""); });
    } else {
      link.readers.push_back(std::move(note));
      deliverNotesLocked(link, later);
    }
  }
  runAll(later);
}

void NixlMesh::deliverNotesLocked(
    ControlLink& link, std::vector<Callback>& later) {
  while (!link.arrived.empty() && !link.readers.empty()) {
    later.push_back(
        [reader = std::move(link.readers.front()),
         text = std::move(link.arrived.front())] { reader("", text); });
    link.readers.pop_front();
    link.arrived.pop_front();
  }
}

void NixlMesh::close() {
  std::vector<Callback> later;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::exchange(closed_, true)) {
      return;
    }
    for (int machine = 0; machine < numMachines(); ++machine) {
      if (machine == topology_.machine()) {
        continue;
      }
      for (int lane = 0; lane < kLanes; ++lane) {
        closeLinkLocked(
            linkLocked(machine, static_cast<Lane>(lane)),
            "the rails were closed on rank " + std::to_string(topology_.rank()),
            later);
      }
      if (thread_.joinable()) {
        queueLocked(
            Notify{
                neighbourOfMachine(machine),
                encode(
                    Message{
                        Kind::kClosed,
                        0,
                        0,
                        0,
                        0,
                        "closed by rank " + std::to_string(topology_.rank())}),
                {}});
      }
    }
  }
  runAll(later);
}

bool NixlMesh::waitingForPeersLocked() const {
  if (!transfers_.empty() || !waiting_.empty() || !heldBack_.empty()) {
    return true;
  }
  for (const auto& link : links_) {
    if (link.read || !link.writes.empty()) {
      return true;
    }
  }
  return false;
}

void NixlMesh::progressLoop() {
  Handle map = nullptr;
  if (api_.createNotifMap(&map) != kSuccess) {
    map = nullptr;
  }
  while (true) {
    bool busy = sendOutgoing();
    busy = pollTransfers() || busy;
    busy = (map != nullptr && pollNotifications(map)) || busy;
    busy = releaseHeldBack() || busy;
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) {
      // What was queued before (farewells, close notices) still goes out.
      lock.unlock();
      sendOutgoing();
      break;
    }
    if (!busy && outbox_.empty()) {
      const std::chrono::microseconds poll =
          waitingForPeersLocked() ? kBusyPoll : kIdlePoll;
      wake_.wait_for(lock, poll);
    }
  }
  if (map != nullptr) {
    api_.destroyNotifMap(map);
  }
}

bool NixlMesh::sendOutgoing() {
  std::deque<Outgoing> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    work.swap(outbox_);
  }
  const bool did = !work.empty();
  const size_t waited = waiting_.size();
  for (size_t index = 0; index < waited; ++index) {
    work.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  for (auto& outgoing : work) {
    if (auto* notify = std::get_if<Notify>(&outgoing)) {
      std::string error;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        error = controlLinks_[notify->neighbour].broken;
      }
      if (error.empty()) {
        const int status = api_.sendNotif(
            agent_,
            peers_[notify->neighbour].agent.c_str(),
            notify->bytes.data(),
            notify->bytes.size(),
            args_);
        if (status != kSuccess) {
          // A peer that exited or cannot be reached: its connections fail
          // now, so the Watch names it without waiting for its silence.
          error = "NIXL could not reach " + describePeer(notify->neighbour) +
              ": " + statusText(status);
          std::vector<Callback> later;
          {
            std::lock_guard<std::mutex> lock(mutex_);
            lostLocked(notify->neighbour, error, later);
          }
          runAll(later);
        }
      }
      if (notify->done) {
        notify->done(error);
      }
    } else {
      auto& post = std::get<Post>(outgoing);
      if (post.write.ready && !post.write.ready->query()) {
        waiting_.push_back(std::move(post));
      } else {
        startTransfer(std::move(post));
      }
    }
  }
  return did;
}

void NixlMesh::startTransfer(Post post) {
  const size_t neighbour = neighbourOfMachine(post.machine);
  const Peer& peer = peers_[neighbour];
  Message arrived{
      Kind::kData,
      post.lane,
      post.seq,
      0,
      post.write.buffer.bytes,
      post.write.tag};
  const std::string notice = encode(arrived);
  auto& done = post.write.done;
  if (post.write.buffer.bytes == 0) {
    const int status = api_.sendNotif(
        agent_, peer.agent.c_str(), notice.data(), notice.size(), args_);
    done(
        status == kSuccess ? ""
                           : "NIXL could not notify " +
                describePeer(neighbour) + ": " + statusText(status));
    return;
  }
  Transfer transfer;
  Handle args = nullptr;
  const MemoryType type = memoryTypeOf(device_);
  int status = api_.createXferList(type, &transfer.local);
  if (status == kSuccess) {
    status = api_.xferListAdd(
        transfer.local,
        reinterpret_cast<uintptr_t>(post.write.buffer.data),
        post.write.buffer.bytes,
        deviceIdOf(device_));
  }
  if (status == kSuccess) {
    status = api_.createXferList(type, &transfer.remote);
  }
  if (status == kSuccess) {
    status = api_.xferListAdd(
        transfer.remote,
        static_cast<uintptr_t>(post.grant.address),
        post.grant.bytes,
        peer.deviceId);
  }
  if (status == kSuccess) {
    status = api_.createOptArgs(&args);
  }
  if (status == kSuccess) {
    status = api_.optArgsAddBackend(args, backend_);
  }
  const bool notify = !post.silent;
  if (status == kSuccess && notify) {
    status = api_.optArgsSetNotifMessage(args, notice.data(), notice.size());
  }
  if (status == kSuccess) {
    status = api_.optArgsSetHasNotif(args, notify);
  }
  if (status == kSuccess) {
    status = api_.createXferRequest(
        agent_,
        kWrite,
        transfer.local,
        transfer.remote,
        peer.agent.c_str(),
        &transfer.request,
        args);
    if (status != kSuccess) {
      transfer.request = nullptr;
    }
  }
  if (status == kSuccess) {
    status = api_.postXferRequest(agent_, transfer.request, args);
  }
  if (args != nullptr) {
    api_.destroyOptArgs(args);
  }
  transfer.done = std::move(done);
  if (status == kInProgress) {
    transfers_.push_back(std::move(transfer));
    return;
  }
  Connection::Done finished = std::move(transfer.done);
  if (transfer.request != nullptr) {
    api_.releaseXferRequest(agent_, transfer.request);
    api_.destroyXferRequest(transfer.request);
  }
  if (transfer.local != nullptr) {
    api_.destroyXferList(transfer.local);
  }
  if (transfer.remote != nullptr) {
    api_.destroyXferList(transfer.remote);
  }
  finished(
      status == kSuccess ? ""
                         : "NIXL (" + backendName_ + ") could not write " +
              std::to_string(post.write.buffer.bytes) + " bytes to " +
              describePeer(neighbour) + ": " + statusText(status) +
              "; check the network between them and UCX_TLS / UCX_NET_DEVICES");
}

bool NixlMesh::pollTransfers() {
  bool did = false;
  for (size_t index = 0; index < transfers_.size();) {
    Transfer& transfer = transfers_[index];
    const int status = api_.xferStatus(agent_, transfer.request);
    if (status == kInProgress) {
      ++index;
      continue;
    }
    did = true;
    Transfer finished = std::move(transfer);
    transfers_.erase(transfers_.begin() + static_cast<std::ptrdiff_t>(index));
    api_.releaseXferRequest(agent_, finished.request);
    api_.destroyXferRequest(finished.request);
    api_.destroyXferList(finished.local);
    api_.destroyXferList(finished.remote);
    finished.done(
        status == kSuccess ? "" : "a NIXL write failed: " + statusText(status));
  }
  return did;
}

bool NixlMesh::pollNotifications(Handle map) {
  if (api_.notifs(agent_, map, nullptr) != kSuccess) {
    return false;
  }
  std::vector<std::pair<std::string, std::string>> received;
  size_t agents = 0;
  api_.notifMapSize(map, &agents);
  for (size_t index = 0; index < agents; ++index) {
    const char* agent = nullptr;
    size_t count = 0;
    if (api_.notifMapAgentAt(map, index, &agent) != kSuccess ||
        agent == nullptr ||
        api_.notifMapCount(map, agent, &count) != kSuccess) {
      continue;
    }
    for (size_t at = 0; at < count; ++at) {
      const void* data = nullptr;
      size_t length = 0;
      if (api_.notifMapGet(map, agent, at, &data, &length) == kSuccess) {
        received.emplace_back(
            agent, std::string(static_cast<const char*>(data), length));
      }
    }
  }
  api_.notifMapClear(map);
  std::vector<Callback> later;
  for (auto& [agent, bytes] : received) {
    onNotification(agent, std::move(bytes), later);
  }
  runAll(later);
  return !received.empty();
}

void NixlMesh::onNotification(
    const std::string& agent, std::string bytes, std::vector<Callback>& later) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = byAgent_.find(agent);
  if (found == byAgent_.end()) {
    ++refused_;
    if (firstRefusal_.empty()) {
      firstRefusal_ = "a notification from agent '" + printable(agent, 64) +
          "', no neighbour";
    }
    return;
  }
  const size_t neighbour = found->second;
  std::string error;
  const auto message = parse(bytes, kLanes, kMaxNoteBytes, error);
  if (!message) {
    misbehavedLocked(neighbour, error, later);
    return;
  }
  if (message->kind == Kind::kNote) {
    ControlLink& link = controlLinks_[neighbour];
    if (!link.broken.empty()) {
      return;
    }
    if (message->seq < link.nextIn || link.early.count(message->seq) ||
        link.early.size() >= kMaxAhead) {
      misbehavedLocked(
          neighbour,
          "note " + std::to_string(message->seq) + " out of order",
          later);
      return;
    }
    link.early.emplace(message->seq, message->text);
    for (auto next = link.early.find(link.nextIn); next != link.early.end();
         next = link.early.find(link.nextIn)) {
      link.arrived.push_back(std::move(next->second));
      link.early.erase(next);
      ++link.nextIn;
    }
    deliverNotesLocked(link, later);
    return;
  }
  if (!isRailPeer(neighbour)) {
    misbehavedLocked(neighbour, "data traffic on a control connection", later);
    return;
  }
  const int machine = machineOfNeighbour(neighbour);
  const Lane lane = static_cast<Lane>(message->lane);
  DataLink& link = linkLocked(machine, lane);
  if (message->kind == Kind::kClosed) {
    for (int each = 0; each < kLanes; ++each) {
      closeLinkLocked(
          linkLocked(machine, static_cast<Lane>(each)),
          describePeer(neighbour) + " closed its rails (" +
              printable(message->text, 200) + ")",
          later);
    }
    return;
  }
  if (!link.closed.empty()) {
    return; // in flight when it closed
  }
  if (message->kind == Kind::kGrant) {
    if (message->seq < link.nextWrite || link.grants.count(message->seq) ||
        link.grants.size() >= kMaxAhead) {
      misbehavedLocked(
          neighbour,
          "grant " + std::to_string(message->seq) + " out of order",
          later);
      return;
    }
    link.grants.emplace(
        message->seq, Grant{message->address, message->bytes, message->text});
    matchLocked(machine, lane, later);
    return;
  }
  // Data or header: the end of the read pending on this link.
  if (!link.read || link.read->seq != message->seq) {
    misbehavedLocked(
        neighbour,
        "message " + std::to_string(message->seq) + " arrived unasked for",
        later);
    return;
  }
  const bool matches = message->text == link.read->tag &&
      message->bytes == link.read->target.bytes;
  if (matches != (message->kind == Kind::kData)) {
    misbehavedLocked(
        neighbour,
        message->kind == Kind::kData ? "it wrote another message than granted"
                                     : "it declined a message it was granted",
        later);
    return;
  }
  Read done = std::move(*link.read);
  link.read.reset();
  Callback arrival = [received = std::move(done.received),
                      tag = message->text,
                      bytes = message->bytes] { received("", tag, bytes); };
  if (slowReceiver_.count() > 0) {
    heldBack_.emplace_back(
        std::chrono::steady_clock::now() + slowReceiver_, std::move(arrival));
  } else {
    later.push_back(std::move(arrival));
  }
}

bool NixlMesh::releaseHeldBack() {
  std::vector<Callback> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    while (!heldBack_.empty() && heldBack_.front().first <= now) {
      due.push_back(std::move(heldBack_.front().second));
      heldBack_.pop_front();
    }
  }
  runAll(due);
  return !due.empty();
}

void NixlMesh::shutdown() {
  close();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) {
    TORCH_CHECK(
        thread_.get_id() != std::this_thread::get_id(),
        "fairring: the NIXL rails were shut down from their own thread");
    thread_.join();
  }
  // Posted writes finish or are given up; then nothing calls back.
  const auto drained = std::chrono::steady_clock::now() + kDrain;
  while (!transfers_.empty() && std::chrono::steady_clock::now() < drained) {
    pollTransfers();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<Callback> later;
  for (auto& transfer : transfers_) {
    if (api_.releaseXferRequest(agent_, transfer.request) == kSuccess) {
      api_.destroyXferRequest(transfer.request);
    }
    api_.destroyXferList(transfer.local);
    api_.destroyXferList(transfer.remote);
    later.push_back(
        [done = std::move(transfer.done)] { done("the rails shut down"); });
  }
  transfers_.clear();
  for (auto& post : waiting_) {
    later.push_back(
        [done = std::move(post.write.done)] { done("the rails shut down"); });
  }
  waiting_.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& outgoing : outbox_) {
      Connection::Done done = std::holds_alternative<Notify>(outgoing)
          ? std::move(std::get<Notify>(outgoing).done)
          : std::move(std::get<Post>(outgoing).write.done);
      if (done) {
        later.push_back(
            [done = std::move(done)] { done("the rails shut down"); });
      }
    }
    outbox_.clear();
    heldBack_.clear();
    for (auto& link : controlLinks_) {
      for (auto& reader : link.readers) {
        later.push_back([reader = std::move(reader)] {
          reader("the rails shut down", "");
        });
      }
      link.readers.clear();
    }
  }
  runAll(later);
  releaseNixl();
}

Connection& NixlMesh::connection(int machine, Lane lane) {
  TORCH_CHECK(
      machine >= 0 && machine < numMachines() && machine != topology_.machine(),
      "fairring: no rail connection to machine ",
      machine);
  return *connections_[static_cast<size_t>(machine) * kLanes + lane];
}

Connection& NixlMesh::control(size_t index) {
  TORCH_CHECK(
      index < controls_.size(),
      "fairring: no control connection to neighbour ",
      index);
  return *controls_[index];
}

std::string NixlMesh::describe() const {
  std::string text =
      "nixl " + backendName_ + " agent " + name_ + " on " + interfaceName_;
  std::lock_guard<std::mutex> lock(mutex_);
  text +=
      "; " + std::to_string(writesWaited_) + " write(s) waited for their grant";
  if (refused_ > 0) {
    text += "; refused " + std::to_string(refused_) +
        " notification(s), first: " + firstRefusal_;
  }
  return text;
}

std::string NixlMesh::downInterface() const {
  std::vector<InterfaceAddress> addresses;
  try {
    addresses = interfaceAddresses();
  } catch (const std::exception&) {
    return "";
  }
  for (const auto& address : addresses) {
    if (address.name == interfaceName_ && !address.up) {
      return address.name;
    }
  }
  return "";
}

} // namespace fairring::rails::nixl

namespace fairring::rails {

std::unique_ptr<Mesh> makeNixlMesh(const MeshSite& site) {
  return std::make_unique<nixl::NixlMesh>(site);
}

} // namespace fairring::rails
