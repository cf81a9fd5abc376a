#include <torch_headers.h> // first: the precompiled torch headers

// The TensorPipe mesh's construction and slots: its context with the
// transports and channels allowed, the listener and the address published,
// the dials to higher peers and the wait for the lower ones' pipes
// (acceptor.h), then the connections (connection.h) by machine and lane.
// Rail switches are in rail_switch.cpp.

#include "rails/tensorpipe/mesh.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <sstream>
#include <string_view>

#include <c10/util/Exception.h>
#include <tensorpipe/tensorpipe.h>

#include "rails/auth/rails_key.h"
#include "rails/interfaces.h"
#include "rails/peer_text.h"
#include "rails/tensorpipe/acceptor.h"
#include "rails/tensorpipe/connection.h"
#include "rails/tensorpipe/cuda.h"
#include "rails/tensorpipe/dial_handshakes.h"
#include "rails/tensorpipe/wire.h"

namespace fairring::rails {

namespace {

tensorpipe::Device tensorpipeDevice(c10::Device device) {
  TORCH_CHECK(
      device.is_cpu() || (device.is_cuda() && device.has_index()),
      "fairring: rails carry CPU or indexed CUDA buffers, not ",
      device);
  return device.is_cuda()
      ? tensorpipe::Device{tensorpipe::kCudaDeviceType, device.index()}
      : tensorpipe::Device{tensorpipe::kCpuDeviceType, 0};
}

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
      encrypt_(site.network.encrypt),
      store_(site.store),
      storePrefix_(site.storePrefix),
      key_(
          auth::railsKey(
              site.store, site.storePrefix + "key", site.network.secret)),
      ownDevice_(tensorpipeDevice(site.device)),
      slots_(site.topology.numMachines(), site.topology.neighbours().size()) {
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
      joined(transportNames) + "; channels " + joined(channelNames) +
      (encrypt_ ? "; authenticated, encrypted (AES-256-GCM)"
                : "; authenticated");

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
      },
      key_,
      listenerName("at " + url_));
  const auto& accepted = accepted_;
  const int expected =
      topology_.machine() * (kLanes + 1) + topology_.localRank();
  acceptForever(listener_, accepted);

  // The dials' handshakes: a pipe is used once its listener proved itself,
  // and placed, with the session its cipher needs, only then.
  DialHandshakes handshakes;
  struct Dialled {
    int peer;
    int lane;
    std::shared_ptr<tensorpipe::Pipe> pipe;
    int deviceIndex;
    size_t handshake;
  };
  std::vector<Dialled> dialled;
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
      const size_t handshake = handshakes.dial(
          pipe,
          encode(Hello{rank, lane, ownDevice.index}),
          key_,
          peer,
          peerUrl);
      dialled.push_back(
          {peer, lane, std::move(pipe), record->deviceIndex, handshake});
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

  const auto deadline = std::chrono::steady_clock::now() + site.timeout;
  const std::string dialFailure = handshakes.wait(deadline);
  std::unique_lock<std::mutex> lock(accepted->mutex);
  // A failed dial fails the build at once: no need to wait for the rest.
  const bool complete =
      !dialFailure.empty() || accepted->changed.wait_until(lock, deadline, [&] {
        return !accepted->error.empty() ||
            static_cast<int>(accepted->pipes.size()) == expected;
      });
  std::string failure = accepted->error.empty() ? dialFailure : accepted->error;
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
    slots_.place(
        topology_.machineOf(entry.hello.rank),
        neighbourIndex(entry.hello.rank),
        entry.hello.lane,
        connectionTo(
            entry.pipe, entry.hello.deviceIndex, entry.session, false));
  }
  lock.unlock();
  if (!failure.empty()) {
    shutdown();
    TORCH_CHECK(false, "fairring: rank ", rank, ": rails mesh: ", failure);
  }
  for (const auto& dial : dialled) {
    slots_.place(
        topology_.machineOf(dial.peer),
        neighbourIndex(dial.peer),
        dial.lane,
        connectionTo(
            dial.pipe,
            dial.deviceIndex,
            handshakes.session(dial.handshake),
            true));
  }
  // Every pipe expected here is in, and established: TensorPipe reads no
  // message before a pipe's own connections have come through the listener,
  // so nothing needs it any more. Open, it would expose the process for the
  // engine's lifetime to TensorPipe's parsing of a new connection's first
  // bytes, which kills it on 8 bytes: zeros crash it (SIGSEGV), 0xff makes it
  // throw std::bad_alloc on its loop thread (abort).
  listener_->close();
  accepted->closeUnsettled();
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
  slots_.apply(ConnectionSlots::Event::kCloseData, /*machine=*/-1, 0);
}

Connection& TensorpipeMesh::connection(int machine, Lane lane) {
  return slots_.data(machine, lane);
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
  return slots_.control(index);
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

std::string TensorpipeMesh::listenerName(const std::string& where) const {
  return "rank " + std::to_string(topology_.rank()) + "'s rails listener " +
      where;
}

size_t TensorpipeMesh::neighbourIndex(int rank) const {
  return static_cast<size_t>(
      std::find(neighbours_.begin(), neighbours_.end(), rank) -
      neighbours_.begin());
}

std::vector<std::string> TensorpipeMesh::spareInterfaces() const {
  return spareNames_;
}

} // namespace fairring::rails
