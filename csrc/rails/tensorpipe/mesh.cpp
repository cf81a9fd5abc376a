#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/tensorpipe/mesh.h"

#include <algorithm>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

#include <c10/util/Exception.h>
#include <tensorpipe/tensorpipe.h>

#include "rails/interfaces.h"
#include "rails/peer_text.h"
#include "rails/tensorpipe/cuda.h"
#include "rails/tensorpipe/wire.h"

namespace fairring::rails {

namespace {

// The lane number a hello gives for a control connection.
constexpr int kControlLane = kLanes;
// Rejected pipes noted for a timeout's error; later ones are only counted.
constexpr size_t kRejectionsNoted = 8;

tensorpipe::Device tensorpipeDevice(c10::Device device) {
  TORCH_CHECK(
      device.is_cpu() || (device.is_cuda() && device.has_index()),
      "fairring: rails carry CPU or indexed CUDA buffers, not ",
      device);
  return device.is_cuda()
      ? tensorpipe::Device{tensorpipe::kCudaDeviceType, device.index()}
      : tensorpipe::Device{tensorpipe::kCpuDeviceType, 0};
}

// A device index a peer may name: 0 on the CPU; a CUDA device index.
bool plausibleDeviceIndex(int index, bool cuda) {
  return cuda
      ? index >= 0 && index <= std::numeric_limits<c10::DeviceIndex>::max()
      : index == 0;
}

// Whether `rank` connects to this rank, and on which lanes: rail peers on
// lower machines open every lane; ranks of this machine with a lower local
// index open a control connection only.
bool connectsHere(const Topology& topology, int rank, int lane) {
  const int machine = topology.machineOf(rank); // -1 if not in the group
  if (machine >= 0 && machine < topology.machine()) {
    return topology.railPeers()[machine] == rank && lane >= 0 &&
        lane <= kControlLane;
  }
  return machine == topology.machine() &&
      topology.localIndexOf(rank) < topology.localRank() &&
      lane == kControlLane;
}

} // namespace

struct AcceptedPipe {
  Hello hello;
  std::shared_ptr<tensorpipe::Pipe> pipe;
};

// Pipes accepted so far, and those rejected; written by TensorPipe's loop
// thread, read by the constructing thread and, for the rejections, by
// describe().
struct Accepted {
  // Why a hello's text is refused, or empty with `hello` set.
  using Check = std::function<std::string(const std::string&, Hello&)>;
  explicit Accepted(Check check) : check(std::move(check)) {}
  const Check check;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<AcceptedPipe> pipes;
  std::set<std::pair<int, int>> seen; // (rank, lane)
  std::vector<std::string> rejections;
  size_t rejected = 0;
  std::string error; // the listener failed

  void reject(const std::shared_ptr<tensorpipe::Pipe>& pipe, std::string why) {
    pipe->close();
    std::lock_guard<std::mutex> lock(mutex);
    if (rejections.size() < kRejectionsNoted) {
      rejections.push_back(std::move(why));
    }
    ++rejected;
  }

  // "rejected N connection(s): [why] ..."; with `mutex` held.
  std::string noted() const {
    std::string text =
        "rejected " + std::to_string(rejected) + " connection(s):";
    for (const auto& why : rejections) {
      text += " [" + why + "]";
    }
    return text;
  }
};

namespace {

void admit(
    const std::shared_ptr<tensorpipe::Pipe>& pipe,
    const std::shared_ptr<Accepted>& accepted) {
  pipe->readDescriptor(
      [pipe, accepted](
          const tensorpipe::Error& error, tensorpipe::Descriptor descriptor) {
        if (error) {
          accepted->reject(
              pipe, "a connection closed before its hello: " + error.what());
          return;
        }
        if (!descriptor.tensors.empty() || !descriptor.payloads.empty()) {
          accepted->reject(pipe, "a hello carried data");
          return;
        }
        Hello hello;
        std::string why = accepted->check(descriptor.metadata, hello);
        if (why.empty()) {
          std::lock_guard<std::mutex> lock(accepted->mutex);
          if (!accepted->seen.emplace(hello.rank, hello.lane).second) {
            why = "a second hello from rank " + std::to_string(hello.rank) +
                " on lane " + std::to_string(hello.lane);
          }
        }
        if (!why.empty()) {
          accepted->reject(pipe, why);
          return;
        }
        pipe->read(
            tensorpipe::Allocation{},
            [pipe, accepted, hello](const tensorpipe::Error& error) {
              if (error) {
                accepted->reject(
                    pipe,
                    "reading the hello of rank " + std::to_string(hello.rank) +
                        ": " + error.what());
                return;
              }
              std::lock_guard<std::mutex> lock(accepted->mutex);
              accepted->pipes.push_back({hello, pipe});
              accepted->changed.notify_all();
            });
      });
}

// Accepts pipes until the listener closes: expected ones are admitted, the
// rest rejected.
void acceptForever(
    const std::shared_ptr<tensorpipe::Listener>& listener,
    const std::shared_ptr<Accepted>& accepted) {
  listener->accept([listener, accepted](
                       const tensorpipe::Error& error,
                       std::shared_ptr<tensorpipe::Pipe> pipe) {
    if (error) {
      std::lock_guard<std::mutex> lock(accepted->mutex);
      accepted->error = "accepting a rail connection: " + error.what();
      accepted->changed.notify_all();
      return;
    }
    admit(pipe, accepted);
    acceptForever(listener, accepted);
  });
}

tensorpipe::Buffer tensorpipeBuffer(const Buffer& buffer) {
  if (buffer.device.is_cpu()) {
    return tensorpipe::CpuBuffer{buffer.data};
  }
  return cudaBuffer(buffer);
}

std::string errorText(const tensorpipe::Error& error) {
  return error ? error.what() : std::string();
}

} // namespace

// One pipe, as a Connection. Its callbacks run on TensorPipe's loop thread.
// Reads check a message's shape against what is expected before TensorPipe
// is given memory for it: TensorPipe trusts the sender's descriptor.
class TensorpipeConnection final : public Connection {
 public:
  // `own`: where this rank's buffers are; `target`: where the peer's are.
  TensorpipeConnection(
      std::shared_ptr<tensorpipe::Pipe> pipe,
      tensorpipe::Device own,
      tensorpipe::Device target)
      : pipe_(std::move(pipe)), own_(own), target_(target) {}

  void write(std::string tag, const Buffer& buffer, Done done) override {
    tensorpipe::Message message;
    message.metadata = std::move(tag);
    // Naming the target device lets TensorPipe send the data at once instead
    // of waiting for the reader to allocate: one round trip less per message.
    message.tensors.push_back(
        {tensorpipeBuffer(buffer), buffer.bytes, target_, ""});
    pipe_->write(
        std::move(message),
        [done = std::move(done)](const tensorpipe::Error& error) {
          done(errorText(error));
        });
  }

  void read(std::string tag, const Buffer& target, Received received) override {
    pipe_->readDescriptor(
        [this, tag = std::move(tag), target, received = std::move(received)](
            const tensorpipe::Error& error, tensorpipe::Descriptor descriptor) {
          if (error) {
            received(errorText(error), "", 0);
            return;
          }
          if (descriptor.tensors.size() != 1 || !descriptor.payloads.empty()) {
            received(
                "a message with " + std::to_string(descriptor.tensors.size()) +
                    " tensors and " +
                    std::to_string(descriptor.payloads.size()) +
                    " payloads arrived where one tensor was expected",
                "",
                0);
            return;
          }
          const auto& tensor = descriptor.tensors[0];
          if (tensor.sourceDevice.type != own_.type || !tensor.targetDevice ||
              !(*tensor.targetDevice == own_)) {
            received(
                "a message from " + tensor.sourceDevice.toString() + " for " +
                    (tensor.targetDevice ? tensor.targetDevice->toString()
                                         : std::string("no named device")) +
                    " arrived where " + own_.toString() + " was expected",
                "",
                0);
            return;
          }
          const size_t bytes = tensor.length;
          if (descriptor.metadata != tag || bytes != target.bytes) {
            // Its payload stays unread: the reader fails the protocol.
            received("", std::move(descriptor.metadata), bytes);
            return;
          }
          tensorpipe::Allocation allocation;
          allocation.tensors.push_back({tensorpipeBuffer(target)});
          pipe_->read(
              std::move(allocation),
              [tag = std::move(descriptor.metadata), bytes, received](
                  const tensorpipe::Error& error) mutable {
                received(errorText(error), std::move(tag), bytes);
              });
        });
  }

  void writeNote(std::string text, Done done) override {
    tensorpipe::Message message;
    message.metadata = std::move(text);
    pipe_->write(
        std::move(message),
        [done = std::move(done)](const tensorpipe::Error& error) {
          done(errorText(error));
        });
  }

  void readNote(Note note) override {
    pipe_->readDescriptor([pipe = pipe_, note = std::move(note)](
                              const tensorpipe::Error& error,
                              tensorpipe::Descriptor descriptor) {
      if (error) {
        note(errorText(error), "");
      } else if (!descriptor.tensors.empty() || !descriptor.payloads.empty()) {
        note("a message with data arrived where a note was expected", "");
      } else if (descriptor.metadata.size() > kMaxNoteBytes) {
        note(
            "a note of " + std::to_string(descriptor.metadata.size()) +
                " bytes arrived (at most " + std::to_string(kMaxNoteBytes) +
                " are allowed)",
            "");
      } else {
        pipe->read(
            tensorpipe::Allocation{},
            [note, text = std::move(descriptor.metadata)](
                const tensorpipe::Error& error) mutable {
              note(errorText(error), error ? std::string() : std::move(text));
            });
      }
    });
  }

  void close() {
    pipe_->close();
  }

 private:
  const std::shared_ptr<tensorpipe::Pipe> pipe_;
  const tensorpipe::Device own_;
  const tensorpipe::Device target_;
};

std::string checkHello(
    const std::string& text,
    const Topology& topology,
    bool cuda,
    int& rank,
    int& lane,
    int& deviceIndex) {
  std::string why;
  const auto hello = parseHello(text, why);
  if (!hello) {
    return why;
  }
  if (hello->generation != 0) {
    return "rank " + std::to_string(hello->rank) +
        " sent a rail switch's hello while the mesh was being built";
  }
  if (!connectsHere(topology, hello->rank, hello->lane)) {
    return "rank " + std::to_string(hello->rank) + " on lane " +
        std::to_string(hello->lane) + " is not a peer that connects to rank " +
        std::to_string(topology.rank());
  }
  if (!plausibleDeviceIndex(hello->deviceIndex, cuda)) {
    return "rank " + std::to_string(hello->rank) + " named device index " +
        std::to_string(hello->deviceIndex);
  }
  rank = hello->rank;
  lane = hello->lane;
  deviceIndex = hello->deviceIndex;
  return "";
}

namespace {

bool named(const std::vector<std::string>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The CPU channels allowed, best first: basic is the only one that crosses
// machines (cma and xth share a host; mpt needs several listeners).
std::vector<std::string> registerCpuChannels(
    tensorpipe::Context& context, const RailsNetwork& network, int rank) {
  TORCH_CHECK(
      named(network.cpuChannels, "basic"),
      "fairring: rank ",
      rank,
      ": the rails need TensorPipe's basic channel to "
      "move CPU buffers between machines; allow it in FAIRRING_CHANNELS");
  context.registerChannel(0, "basic", tensorpipe::channel::basic::create());
  return {"basic"};
}

// "uv://10.0.0.1" or "uv://[fd00::1]": TensorPipe's URL for `address`.
std::string listenUrl(
    const std::string& transport, const std::string& address) {
  const bool ipv6 = address.find(':') != std::string::npos;
  return transport + "://" + (ipv6 ? "[" + address + "]" : address);
}

} // namespace

TensorpipeMesh::TensorpipeMesh(const MeshSite& site)
    : topology_(site.topology),
      listenHost_(site.network.listenAddress),
      interfaceName_(site.network.interfaceName),
      spareNames_(site.network.spareInterfaces),
      spareAddresses_(site.network.spareAddresses),
      resends_(site.network.railFailover),
      store_(site.store),
      storePrefix_(site.storePrefix),
      ownDevice_(tensorpipeDevice(site.device)),
      connections_(site.topology.numMachines()) {
  TORCH_CHECK(
      spareNames_.size() == spareAddresses_.size() &&
          (spareNames_.empty() || resends_),
      "fairring: ",
      spareNames_.size(),
      " spare interfaces with ",
      spareAddresses_.size(),
      " addresses");
  neighbours_ = topology_.neighbours();
  const int rank = topology_.rank();
  const tensorpipe::Device ownDevice = ownDevice_;
  controls_.resize(neighbours_.size());
  const auto neighbourIndex = [&](int peer) {
    return this->neighbourIndex(peer);
  };

  context_ =
      std::make_shared<tensorpipe::Context>(tensorpipe::ContextOptions().name(
          "fairring-rank-" + std::to_string(rank)));
  // uv carries every pipe's handshake (the URL a peer dials is the uv one);
  // TensorPipe then moves the pipe's data to the highest-priority transport
  // that both ends registered, so the order given (best first) sets it.
  std::vector<std::string>& transportNames = transportNames_;
  const auto& transports = site.network.transports;
  for (size_t index = 0; index < transports.size(); ++index) {
    const auto& name = transports[index];
    const auto priority = static_cast<int64_t>(transports.size() - index) * 10;
    std::shared_ptr<tensorpipe::transport::Context> transport;
    if (name == "uv") {
      transport = tensorpipe::transport::uv::create();
    } else if (name == "ibv") {
      transport = tensorpipe::transport::ibv::create();
    } else {
      TORCH_CHECK(false, "fairring: no rails transport named '", name, "'");
    }
    if (!transport->isViable()) {
      // uv is always viable; ibv is not without libibverbs.so.1 or a device.
      TORCH_CHECK(
          !site.network.isRequired(name),
          "fairring: rank ",
          rank,
          ": the rails were asked to use TensorPipe's ",
          name,
          " transport (FAIRRING_TRANSPORTS), but it is not viable in this "
          "process (ibv needs libibverbs.so.1 and an active InfiniBand or RoCE "
          "device); allow uv, or fix the device");
      continue;
    }
    context_->registerTransport(priority, name, std::move(transport));
    transportNames.push_back(name);
  }
  TORCH_CHECK(
      named(transportNames, "uv"),
      "fairring: the rails need TensorPipe's uv (TCP) transport for every "
      "pipe's handshake; it was not among ",
      transports.size(),
      " allowed");
  std::vector<std::string> channelNames = site.device.is_cuda()
      ? registerCudaChannels(*context_, site.network, rank)
      : registerCpuChannels(*context_, site.network, rank);
  cudaBasic_ = named(channelNames, "cuda_basic");
  const auto joined = [](const std::vector<std::string>& names) {
    std::string text;
    for (const auto& name : names) {
      text += (text.empty() ? "" : ", ") + name;
    }
    return text;
  };
  transports_ = site.network.interfaceName + "; transports " +
      joined(transportNames) + "; channels " + joined(channelNames);

  listener_ = context_->listen(listenUrls(site.network.listenAddress));
  url_ = listener_->url("uv");
  // What a connecting peer needs to know (wire.h).
  const std::string published = encode(AddressRecord{ownDevice.index, url_});
  site.store->set(
      site.storePrefix + "url/" + std::to_string(rank),
      std::vector<uint8_t>(published.begin(), published.end()));

  // Rail peers on lower machines connect to us (every lane), and so do the
  // ranks of this machine with a lower local index (control).
  accepted_ = std::make_shared<Accepted>(
      [topology = topology_, cuda = site.device.is_cuda()](
          const std::string& text, Hello& hello) {
        return checkHello(
            text, topology, cuda, hello.rank, hello.lane, hello.deviceIndex);
      });
  const auto& accepted = accepted_;
  const int expected =
      topology_.machine() * (kLanes + 1) + topology_.localRank();
  acceptForever(listener_, accepted);

  auto writeError = std::make_shared<std::pair<std::mutex, std::string>>();
  const auto connectTo = [&](int peer,
                             const std::vector<int>& lanes,
                             const std::vector<uint8_t>& bytes) {
    std::string why;
    const auto record = parseAddressRecord(
        std::string_view(
            reinterpret_cast<const char*>(bytes.data()), bytes.size()),
        why);
    if (record &&
        !plausibleDeviceIndex(record->deviceIndex, site.device.is_cuda())) {
      why = "a malformed address '" + printable(encode(*record), 200) + "'";
    }
    TORCH_CHECK(
        why.empty(),
        "fairring: rank ",
        rank,
        ": rails mesh: rank ",
        peer,
        " published ",
        why,
        " (are all ranks running the same fairring?)");
    const std::string& peerUrl = record->url;
    for (int lane : lanes) {
      auto pipe = context_->connect(peerUrl);
      tensorpipe::Message hello;
      hello.metadata = encode(Hello{rank, lane, ownDevice.index});
      pipe->write(
          std::move(hello), [writeError, peer](const tensorpipe::Error& error) {
            if (error) {
              std::lock_guard<std::mutex> lock(writeError->first);
              writeError->second = "connecting to rail peer rank " +
                  std::to_string(peer) + ": " + error.what();
            }
          });
      auto connection = std::make_unique<TensorpipeConnection>(
          std::move(pipe),
          ownDevice,
          tensorpipe::Device{ownDevice.type, record->deviceIndex});
      if (lane == kControlLane) {
        controls_[neighbourIndex(peer)] = std::move(connection);
      } else {
        connections_[topology_.machineOf(peer)][lane] = std::move(connection);
      }
    }
  };
  // Rail peers on higher machines (every lane), then the ranks of this
  // machine with a higher local index (control): their addresses in one
  // store round trip, which waits until all are published.
  std::vector<std::pair<int, std::vector<int>>> dials;
  for (int machine = topology_.machine() + 1; machine < numMachines();
       ++machine) {
    dials.emplace_back(
        peerRank(machine), std::vector<int>{kShards, kReduced, kControlLane});
  }
  const auto& local = topology_.localRanks();
  for (int index = topology_.localRank() + 1;
       index < static_cast<int>(local.size());
       ++index) {
    dials.emplace_back(local[index], std::vector<int>{kControlLane});
  }
  if (!dials.empty()) {
    std::vector<std::string> keys;
    for (const auto& dial : dials) {
      keys.push_back(site.storePrefix + "url/" + std::to_string(dial.first));
    }
    const auto records = site.store->multiGet(keys);
    for (size_t index = 0; index < dials.size(); ++index) {
      connectTo(dials[index].first, dials[index].second, records.at(index));
    }
  }

  std::unique_lock<std::mutex> lock(accepted->mutex);
  const bool complete = accepted->changed.wait_for(lock, site.timeout, [&] {
    return !accepted->error.empty() ||
        static_cast<int>(accepted->pipes.size()) == expected;
  });
  std::string failure = accepted->error;
  if (failure.empty() && !complete) {
    std::ostringstream missing;
    for (int peer : neighbours_) {
      const int lanes = connectsHere(topology_, peer, 0) ? kLanes + 1
          : connectsHere(topology_, peer, kControlLane)  ? 1
                                                         : 0;
      int arrived = 0;
      for (const auto& entry : accepted->pipes) {
        arrived += entry.hello.rank == peer;
      }
      if (arrived < lanes) {
        missing << " " << peer;
      }
    }
    failure = "timed out after " + std::to_string(site.timeout.count()) +
        " ms waiting for rank(s)" + missing.str() + " to connect to " + url_;
    if (accepted->rejected > 0) {
      failure += "; " + accepted->noted();
    }
  }
  for (const auto& entry : accepted->pipes) {
    auto connection = std::make_unique<TensorpipeConnection>(
        entry.pipe,
        ownDevice,
        tensorpipe::Device{ownDevice.type, entry.hello.deviceIndex});
    if (entry.hello.lane == kControlLane) {
      controls_[neighbourIndex(entry.hello.rank)] = std::move(connection);
    } else {
      connections_[topology_.machineOf(entry.hello.rank)][entry.hello.lane] =
          std::move(connection);
    }
  }
  lock.unlock();
  {
    std::lock_guard<std::mutex> writeLock(writeError->first);
    if (failure.empty()) {
      failure = writeError->second;
    }
  }
  if (!failure.empty()) {
    shutdown();
    TORCH_CHECK(false, "fairring: rank ", rank, ": rails mesh: ", failure);
  }
  // Every pipe expected here is in, and established: TensorPipe reads no
  // message before a pipe's own connections have come through the listener,
  // so nothing needs it any more. Open, it would expose the process for the
  // engine's lifetime to TensorPipe's parsing of a new connection's first
  // bytes, which kills it on 8 bytes: zeros crash it (SIGSEGV), 0xff makes it
  // throw std::bad_alloc on its loop thread (abort).
  listener_->close();
}

std::string TensorpipeMesh::describe() const {
  std::string text = url_ + " (" + transports_ + ")";
  std::lock_guard<std::mutex> lock(accepted_->mutex);
  if (accepted_->rejected > 0) {
    text += "; " + accepted_->noted();
  }
  return text;
}

TensorpipeMesh::~TensorpipeMesh() {
  shutdown();
}

void TensorpipeMesh::shutdown() {
  context_->close();
  context_->join();
}

void TensorpipeMesh::close() {
  std::vector<TensorpipeConnection*> open;
  {
    std::lock_guard<std::mutex> lock(slotsMutex_);
    for (const auto& lanes : connections_) {
      for (const auto& connection : lanes) {
        if (connection) {
          open.push_back(connection.get());
        }
      }
    }
  }
  closeUnlocked(open);
}

void TensorpipeMesh::closeUnlocked(
    const std::vector<TensorpipeConnection*>& connections) {
  // TensorPipe may run the loop, callbacks included, on the closing thread:
  // they reach for the slots, so no lock may be held here. The connections
  // themselves live until shutdown (replaced_).
  for (TensorpipeConnection* connection : connections) {
    connection->close();
  }
}

Connection& TensorpipeMesh::connection(int machine, Lane lane) {
  std::lock_guard<std::mutex> lock(slotsMutex_);
  const auto& connection = connections_.at(machine)[lane];
  TORCH_CHECK(connection, "fairring: no rail connection to machine ", machine);
  return *connection;
}

std::string TensorpipeMesh::downInterface() const {
  std::vector<InterfaceAddress> addresses;
  try {
    addresses = interfaceAddresses();
  } catch (const std::exception&) {
    return ""; // only explains a failure; never causes one
  }
  for (const auto& address : addresses) {
    if (address.address == listenHost_) {
      return address.up ? "" : address.name;
    }
  }
  return "";
}

Connection& TensorpipeMesh::control(size_t index) {
  std::lock_guard<std::mutex> lock(slotsMutex_);
  TORCH_CHECK(
      index < controls_.size() && controls_[index],
      "fairring: no control connection to neighbour ",
      index);
  return *controls_[index];
}

std::vector<std::string> TensorpipeMesh::listenUrls(
    const std::string& address) const {
  std::vector<std::string> urls{listenUrl("uv", address)};
  for (const auto& name : transportNames_) {
    if (name != "uv") {
      urls.push_back(listenUrl(name, address));
    }
  }
  return urls;
}

size_t TensorpipeMesh::neighbourIndex(int rank) const {
  return static_cast<size_t>(
      std::find(neighbours_.begin(), neighbours_.end(), rank) -
      neighbours_.begin());
}

std::vector<std::string> TensorpipeMesh::spareInterfaces() const {
  return spareNames_;
}

std::unique_ptr<TensorpipeConnection> TensorpipeMesh::connectionTo(
    const std::shared_ptr<tensorpipe::Pipe>& pipe, int deviceIndex) const {
  return std::make_unique<TensorpipeConnection>(
      pipe, ownDevice_, tensorpipe::Device{ownDevice_.type, deviceIndex});
}

void TensorpipeMesh::detach(int machine) {
  std::vector<TensorpipeConnection*> closing;
  {
    std::lock_guard<std::mutex> lock(slotsMutex_);
    for (const auto& connection : connections_.at(machine)) {
      closing.push_back(connection.get());
    }
    closing.push_back(controls_.at(neighbourIndex(peerRank(machine))).get());
  }
  closeUnlocked(closing);
}

void TensorpipeMesh::install(
    int machine, std::vector<std::unique_ptr<TensorpipeConnection>> made) {
  std::lock_guard<std::mutex> lock(slotsMutex_);
  for (int lane = 0; lane < kLanes; ++lane) {
    replaced_.push_back(
        std::exchange(connections_[machine][lane], std::move(made[lane])));
  }
  replaced_.push_back(
      std::exchange(
          controls_[neighbourIndex(peerRank(machine))],
          std::move(made[kControlLane])));
}

namespace {

// Waits on `condition` (under `lock`) until `done()`, `deadline` or
// `cancelled()`: true if done.
bool waitUntil(
    std::condition_variable& condition,
    std::unique_lock<std::mutex>& lock,
    std::chrono::steady_clock::time_point deadline,
    const std::function<bool()>& cancelled,
    const std::function<bool()>& done) {
  while (!done()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline || cancelled()) {
      return false;
    }
    condition.wait_until(
        lock, std::min(deadline, now + std::chrono::milliseconds(50)));
  }
  return true;
}

} // namespace

TensorpipeMesh::Switched TensorpipeMesh::acceptSwitch(
    const SwitchCall& call, const std::string& interface) {
  const int peer = call.peer;
  const uint64_t generation = call.generation;
  std::string address = interface == interfaceName_ ? listenHost_ : "";
  for (size_t index = 0; index < spareNames_.size(); ++index) {
    if (spareNames_[index] == interface) {
      address = spareAddresses_[index];
    }
  }
  TORCH_CHECK(!address.empty(), "no address known for interface ", interface);
  const bool cuda = ownDevice_.type == tensorpipe::kCudaDeviceType;
  auto accepted = std::make_shared<Accepted>(
      [peer, generation, cuda](const std::string& text, Hello& hello) {
        std::string why;
        const auto parsed = parseHello(text, why);
        if (!parsed) {
          return why;
        }
        if (parsed->rank != peer || parsed->lane < 0 ||
            parsed->lane > kControlLane || parsed->generation != generation ||
            !plausibleDeviceIndex(parsed->deviceIndex, cuda)) {
          return "'" + printable(text, 120) + "' is not rank " +
              std::to_string(peer) + "'s hello for rail switch " +
              std::to_string(generation);
        }
        hello = *parsed;
        return std::string();
      });
  auto listener = context_->listen(listenUrls(address));
  acceptForever(listener, accepted);
  const std::string url = listener->url("uv");
  const std::string published =
      encode(SwitchRecord{ownDevice_.index, call.received, url});
  store_->set(
      call.key, std::vector<uint8_t>(published.begin(), published.end()));
  std::unique_lock<std::mutex> lock(accepted->mutex);
  const bool complete =
      waitUntil(accepted->changed, lock, call.deadline, call.cancelled, [&] {
        return !accepted->error.empty() ||
            accepted->pipes.size() == static_cast<size_t>(kLanes + 1);
      });
  // Before closing, whose "listener closed" is no failure.
  const std::string error = accepted->error;
  // Closing runs the accept callback, which takes the lock, on this thread.
  lock.unlock();
  listener->close(); // this switch's pipes are in, or never will be
  lock.lock();
  Switched switched;
  switched.pipes.resize(kLanes + 1);
  if (!complete || !error.empty()) {
    const auto taken = accepted->pipes;
    lock.unlock(); // closing may run their callbacks here, which lock
    for (const auto& entry : taken) {
      entry.pipe->close();
    }
    lock.lock();
    TORCH_CHECK(
        false,
        "rank ",
        peer,
        " did not connect to ",
        url,
        " (",
        interface,
        ")",
        error.empty() ? "" : ": " + error,
        accepted->rejected > 0 ? "; " + accepted->noted() : "");
  }
  for (const auto& entry : accepted->pipes) {
    switched.pipes[entry.hello.lane] = entry.pipe;
    switched.peerReceived = entry.hello.received;
    switched.peerDevice = entry.hello.deviceIndex;
  }
  return switched;
}

TensorpipeMesh::Switched TensorpipeMesh::dialSwitch(const SwitchCall& call) {
  const int peer = call.peer;
  // The peer publishes where it listens once it has stopped using the old
  // connections: wait for it here, off the transport's thread.
  while (!store_->check({call.key})) {
    TORCH_CHECK(
        std::chrono::steady_clock::now() < call.deadline && !call.cancelled(),
        "rank ",
        peer,
        " did not open a listener for rail switch ",
        call.generation);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto bytes = store_->get(call.key);
  std::string why;
  const auto record = parseSwitchRecord(
      std::string_view(
          reinterpret_cast<const char*>(bytes.data()), bytes.size()),
      why);
  TORCH_CHECK(
      record &&
          plausibleDeviceIndex(
              record->deviceIndex,
              ownDevice_.type == tensorpipe::kCudaDeviceType),
      "rank ",
      peer,
      " published ",
      why.empty() ? "an implausible device index" : why);
  Switched switched{{}, record->received, record->deviceIndex};
  struct Written {
    std::mutex mutex;
    std::condition_variable changed;
    int done = 0;
    std::string error;
  };
  auto written = std::make_shared<Written>();
  for (int lane = 0; lane <= kControlLane; ++lane) {
    auto pipe = context_->connect(record->url);
    tensorpipe::Message hello;
    hello.metadata = encode(
        Hello{
            topology_.rank(),
            lane,
            ownDevice_.index,
            call.generation,
            call.received});
    pipe->write(std::move(hello), [written](const tensorpipe::Error& error) {
      std::lock_guard<std::mutex> lock(written->mutex);
      ++written->done;
      if (error && written->error.empty()) {
        written->error = error.what();
      }
      written->changed.notify_all();
    });
    switched.pipes.push_back(std::move(pipe));
  }
  std::unique_lock<std::mutex> lock(written->mutex);
  const bool complete =
      waitUntil(written->changed, lock, call.deadline, call.cancelled, [&] {
        return written->done == kLanes + 1;
      });
  if (!complete || !written->error.empty()) {
    lock.unlock(); // closing may run their callbacks here, which lock
    for (const auto& pipe : switched.pipes) {
      pipe->close();
    }
    lock.lock();
    TORCH_CHECK(
        false,
        "connecting to rank ",
        peer,
        " at ",
        record->url,
        written->error.empty() ? " timed out" : " failed: " + written->error);
  }
  return switched;
}

ReceivedCounts TensorpipeMesh::reconnect(
    int machine,
    const std::string& interface,
    uint64_t generation,
    ReceivedCounts received,
    std::chrono::steady_clock::time_point deadline,
    const std::function<bool()>& cancelled) {
  const int peer = peerRank(machine);
  const int rank = topology_.rank();
  const std::string key = storePrefix_ + "switch/" +
      std::to_string(std::min(rank, peer)) + "-" +
      std::to_string(std::max(rank, peer)) + "/" + std::to_string(generation);
  const SwitchCall call{peer, generation, received, key, deadline, cancelled};
  // As at construction, the lower machine's rank dials.
  const Switched switched = machine < topology_.machine()
      ? acceptSwitch(call, interface)
      : dialSwitch(call);
  std::vector<std::unique_ptr<TensorpipeConnection>> made;
  for (const auto& pipe : switched.pipes) {
    made.push_back(connectionTo(pipe, switched.peerDevice));
  }
  install(machine, std::move(made));
  return switched.peerReceived;
}

} // namespace fairring::rails
