#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/nixl/mesh.h"
#include "rails/nixl/factory.h"

#include <cstdlib>
#include <random>
#include <sstream>

#include <c10/util/Exception.h>

#include "rails/auth/rails_key.h"
#include "rails/interfaces.h"
#include "rails/peer_text.h"
#include "test_switches.h"
#include "thread_name.h"

namespace fairring::rails::nixl {

namespace {

// How long shutdown lets posted writes finish before releasing them.
constexpr auto kDrain = std::chrono::seconds(2);

std::string randomHex() {
  std::random_device device;
  std::ostringstream out;
  out << std::hex << (static_cast<uint64_t>(device()) << 32 | device());
  return out.str();
}

} // namespace

TestKnobs TestKnobs::fromEnvironment() {
  TestKnobs knobs;
  if (const auto slow = testSwitch(TestSwitch::kNixlSlowReceiverMs)) {
    size_t used = 0;
    int milliseconds = -1;
    try {
      milliseconds = std::stoi(*slow, &used);
    } catch (const std::exception&) {
    }
    TORCH_CHECK(
        used == slow->size() && milliseconds >= 0,
        "fairring: ",
        testSwitchName(TestSwitch::kNixlSlowReceiverMs),
        "='",
        *slow,
        "' needs a non-negative number of milliseconds");
    knobs.slowReceiver = std::chrono::milliseconds(milliseconds);
  }
  knobs.ungrantedWrites =
      testSwitch(TestSwitch::kNixlUngrantedWrites).value_or("") == "1";
  return knobs;
}

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

NixlMesh::NixlMesh(const MeshSite& site, const Api& api, TestKnobs knobs)
    : topology_(site.topology),
      device_(site.device),
      timeout_(site.timeout),
      store_(site.store),
      storePrefix_(site.storePrefix + "nixl/"),
      key_(
          auth::railsKey(
              site.store, site.storePrefix + "key", site.network.secret)),
      backendName_(site.network.nixlBackend),
      interfaceName_(site.network.interfaceName),
      knobs_(knobs),
      name_(
          "fairring-rank" + std::to_string(site.topology.rank()) + "-" +
          randomHex()) {
  TORCH_CHECK(
      site.device.is_cpu() ||
          (site.device.is_cuda() && site.device.has_index()),
      "fairring: the NIXL rails carry CPU or indexed CUDA buffers, not ",
      site.device);
  neighbours_ = topology_.neighbours();
  for (int index = 0; index < numMachines() * kLanes; ++index) {
    links_.emplace_back(/*lane=*/index % kLanes);
  }
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
  agent_ = std::make_unique<Agent>(api, name_, backendName_, topology_.rank());
}

NixlMesh::~NixlMesh() {
  shutdown();
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

DataLink& NixlMesh::linkLocked(int machine, Lane lane) {
  return links_[static_cast<size_t>(machine) * kLanes + lane];
}

std::string NixlMesh::describePeer(size_t neighbour) const {
  return std::string(isRailPeer(neighbour) ? "rail peer" : "rank") + " " +
      std::to_string(neighbours_[neighbour]);
}

void NixlMesh::registerStaging(const Buffer& staging) {
  TORCH_CHECK(
      staging.data != nullptr && staging.bytes > 0 && staging.device == device_,
      "fairring: the NIXL rails need staging on ",
      device_);
  agent_->registerStaging(staging);
  staging_ = staging;
  StagingRecord own;
  own.rank = static_cast<uint64_t>(topology_.rank());
  own.agent = name_;
  own.memoryType = static_cast<uint64_t>(memoryTypeOf(device_));
  own.deviceId = deviceIdOf(device_);
  own.address = addressOf(staging.data);
  own.bytes = staging.bytes;
  own.agentMetadata = agent_->metadata();
  peers_ = exchangeStagingRecords(
      *store_, storePrefix_, key_, own, neighbours_, *agent_, timeout_);
  for (size_t index = 0; index < peers_.size(); ++index) {
    byAgent_[peers_[index].agent] = index;
  }
  thread_ = std::thread([this] {
    nameThisThread("fr-nixl");
    progressLoop();
  });
}

std::string NixlMesh::checkBuffer(
    const Buffer& buffer, const char* what) const {
  if (staging_.data == nullptr) {
    return "the NIXL rails moved data before their staging was registered";
  }
  if (buffer.device != device_ ||
      !inside(
          addressOf(staging_.data),
          staging_.bytes,
          addressOf(buffer.data),
          buffer.bytes)) {
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

void NixlMesh::applyLocked(
    int machine,
    Lane lane,
    LinkEffects& effects,
    std::vector<Callback>& later) {
  const size_t neighbour = neighbourOfMachine(machine);
  for (auto& step : effects.steps) {
    if (auto* grant = std::get_if<SendGrant>(&step)) {
      // A grant that cannot be sent closes its link: no write will come.
      queueLocked(
          Notify{
              neighbour,
              encode(grant->grant),
              [this, machine, lane](const std::string& error) {
                if (error.empty()) {
                  return;
                }
                std::vector<Callback> failed;
                {
                  std::lock_guard<std::mutex> lock(mutex_);
                  closeLinkLocked(machine, lane, error, failed);
                }
                runAll(failed);
              }});
    } else if (auto* decline = std::get_if<Decline>(&step)) {
      queueLocked(
          Notify{neighbour, encode(decline->header), std::move(decline->done)});
    } else {
      queueLocked(Post{machine, lane, std::move(std::get<StartWrite>(step))});
    }
  }
  for (auto& failed : effects.failed) {
    later.push_back(std::move(failed));
  }
  if (knobs_.ungrantedWrites) {
    if (auto stray = linkLocked(machine, lane).strayWrite()) {
      queueLocked(Post{machine, lane, std::move(*stray)});
    }
  }
}

void NixlMesh::arrivedLocked(Callback arrival, std::vector<Callback>& later) {
  if (knobs_.slowReceiver.count() > 0) {
    heldBack_.emplace_back(
        std::chrono::steady_clock::now() + knobs_.slowReceiver,
        std::move(arrival));
  } else {
    later.push_back(std::move(arrival));
  }
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
    const std::string error = checkBuffer(target, "a receive's target");
    LinkEffects effects;
    if (error.empty()) {
      linkLocked(machine, lane)
          .read(std::move(tag), target, std::move(received), effects);
    } else {
      effects.failed.push_back(
          [received = std::move(received), error] { received(error, "", 0); });
    }
    applyLocked(machine, lane, effects, later);
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
    const std::string error = checkBuffer(buffer, "a send's buffer");
    LinkEffects effects;
    if (error.empty()) {
      Write queued{std::move(tag), buffer, std::move(done), nullptr};
      if (buffer.stream) {
        // NIXL reads the bytes off the stream's order: it waits for them.
        queued.ready =
            std::make_shared<c10::Event>(buffer.stream->device_type());
        queued.ready->record(*buffer.stream);
      }
      if (linkLocked(machine, lane).write(std::move(queued), effects)) {
        ++writesWaited_;
      }
    } else {
      effects.failed.push_back(
          [done = std::move(done), error] { done(error); });
    }
    applyLocked(machine, lane, effects, later);
  }
  runAll(later);
}

void NixlMesh::closeLinkLocked(
    int machine,
    Lane lane,
    const std::string& why,
    std::vector<Callback>& later) {
  LinkEffects effects;
  linkLocked(machine, lane).close(why, effects);
  applyLocked(machine, lane, effects, later);
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
    size_t neighbour, const std::string& why, std::vector<Callback>& later) {
  if (isRailPeer(neighbour)) {
    const int machine = machineOfNeighbour(neighbour);
    for (int lane = 0; lane < kLanes; ++lane) {
      closeLinkLocked(machine, static_cast<Lane>(lane), why, later);
    }
  }
  controlLinks_[neighbour].fail(why, later);
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
    broken = link.broken();
    if (broken.empty()) {
      const Message note{Kind::kNote, 0, link.nextOut(), 0, 0, std::move(text)};
      queueLocked(Notify{neighbour, encode(note), std::move(done)});
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
    if (stopping_ && link.broken().empty()) {
      later.push_back(
          [note = std::move(note)] { note("the rails shut down", ""); });
    } else {
      link.read(std::move(note), later);
    }
  }
  runAll(later);
}

void NixlMesh::close() {
  std::vector<Callback> later;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::exchange(closed_, true)) {
      return;
    }
    const std::string rank = std::to_string(topology_.rank());
    for (int machine = 0; machine < numMachines(); ++machine) {
      if (machine == topology_.machine()) {
        continue;
      }
      for (int lane = 0; lane < kLanes; ++lane) {
        closeLinkLocked(
            machine,
            static_cast<Lane>(lane),
            "the rails were closed on rank " + rank,
            later);
      }
      if (thread_.joinable()) {
        const Message closed{
            Kind::kClosed, 0, 0, 0, 0, "closed by rank " + rank};
        queueLocked(Notify{neighbourOfMachine(machine), encode(closed), {}});
      }
    }
  }
  runAll(later);
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
  const std::string why = "the rails shut down";
  std::vector<Callback> later;
  for (auto& posted : std::exchange(transfers_, {})) {
    later.push_back([done = std::move(posted.done), why] { done(why); });
  }
  for (auto& post : std::exchange(waiting_, {})) {
    later.push_back(
        [done = std::move(post.start.write.done), why] { done(why); });
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& outgoing : std::exchange(outbox_, {})) {
      Connection::Done done = std::holds_alternative<Notify>(outgoing)
          ? std::move(std::get<Notify>(outgoing).done)
          : std::move(std::get<Post>(outgoing).start.write.done);
      if (done) {
        later.push_back([done = std::move(done), why] { done(why); });
      }
    }
    heldBack_.clear();
    for (auto& link : controlLinks_) {
      link.fail(why, later);
    }
  }
  runAll(later);
  agent_.reset();
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
  return std::make_unique<nixl::NixlMesh>(
      site,
      nixl::load(site.network.nixlLibrary),
      nixl::TestKnobs::fromEnvironment());
}

} // namespace fairring::rails
