#include "rails/tensorpipe_mesh.h"

#include <condition_variable>
#include <mutex>
#include <sstream>

#include <c10/util/Exception.h>
#include <tensorpipe/tensorpipe.h>

#include "rails/tensorpipe_cuda.h"

namespace fairring::rails {

namespace {

constexpr const char* kHello = "fairring-rails-hello";

// Says who opens a pipe: rank, lane, and the index of the device its buffers
// are on (the type is the mesh's).
std::string helloMetadata(int rank, Lane lane, int deviceIndex) {
  return std::string(kHello) + " " + std::to_string(rank) + " " +
      std::to_string(static_cast<int>(lane)) + " " +
      std::to_string(deviceIndex);
}

tensorpipe::Device tensorpipeDevice(c10::Device device) {
  TORCH_CHECK(
      device.is_cpu() || (device.is_cuda() && device.has_index()),
      "fairring: rails carry CPU or indexed CUDA buffers, not ",
      device);
  return device.is_cuda()
      ? tensorpipe::Device{tensorpipe::kCudaDeviceType, device.index()}
      : tensorpipe::Device{tensorpipe::kCpuDeviceType, 0};
}

struct AcceptedPipe {
  int rank;
  int lane;
  int deviceIndex;
  std::shared_ptr<tensorpipe::Pipe> pipe;
};

// Pipes accepted so far; written by TensorPipe's loop thread, read by the
// constructing thread.
struct Accepted {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<AcceptedPipe> pipes;
  std::string error;
};

void acceptNext(
    const std::shared_ptr<tensorpipe::Listener>& listener,
    const std::shared_ptr<Accepted>& accepted,
    int remaining) {
  if (remaining == 0) {
    return;
  }
  listener->accept([listener, accepted, remaining](
                       const tensorpipe::Error& error,
                       std::shared_ptr<tensorpipe::Pipe> pipe) {
    if (error) {
      std::lock_guard<std::mutex> lock(accepted->mutex);
      accepted->error = "accepting a rail connection: " + error.what();
      accepted->changed.notify_all();
      return;
    }
    pipe->readDescriptor([pipe, accepted](
                             const tensorpipe::Error& error,
                             tensorpipe::Descriptor descriptor) {
      std::istringstream hello(descriptor.metadata);
      std::string word;
      int rank = -1;
      int lane = -1;
      int deviceIndex = -1;
      hello >> word >> rank >> lane >> deviceIndex;
      if (error || word != kHello || lane < 0 || lane >= kLanes ||
          deviceIndex < 0) {
        std::lock_guard<std::mutex> lock(accepted->mutex);
        accepted->error = error
            ? "reading a rail peer's hello: " + error.what()
            : "a rail connection did not start with fairring's hello";
        accepted->changed.notify_all();
        return;
      }
      pipe->read(
          tensorpipe::Allocation{},
          [pipe, accepted, rank, lane, deviceIndex](
              const tensorpipe::Error& error) {
            std::lock_guard<std::mutex> lock(accepted->mutex);
            if (error) {
              accepted->error = "reading the hello of rank " +
                  std::to_string(rank) + ": " + error.what();
            } else {
              accepted->pipes.push_back({rank, lane, deviceIndex, pipe});
            }
            accepted->changed.notify_all();
          });
    });
    acceptNext(listener, accepted, remaining - 1);
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
class TensorpipeConnection final : public Connection {
 public:
  TensorpipeConnection(
      std::shared_ptr<tensorpipe::Pipe> pipe,
      tensorpipe::Device target)
      : pipe_(std::move(pipe)), target_(target) {}

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

  void readHeader(Header header) override {
    pipe_->readDescriptor([header = std::move(header)](
                              const tensorpipe::Error& error,
                              tensorpipe::Descriptor descriptor) {
      if (error) {
        header(errorText(error), "", 0);
      } else if (descriptor.tensors.size() != 1) {
        header(
            "a message with " + std::to_string(descriptor.tensors.size()) +
                " payloads arrived ('" + descriptor.metadata + "')",
            "",
            0);
      } else {
        header("", descriptor.metadata, descriptor.tensors[0].length);
      }
    });
  }

  void readPayload(const Buffer& buffer, Done done) override {
    tensorpipe::Allocation allocation;
    allocation.tensors.push_back({tensorpipeBuffer(buffer)});
    pipe_->read(
        std::move(allocation),
        [done = std::move(done)](const tensorpipe::Error& error) {
          done(errorText(error));
        });
  }

  void close() {
    pipe_->close();
  }

 private:
  const std::shared_ptr<tensorpipe::Pipe> pipe_;
  const tensorpipe::Device target_;
};

namespace {
} // namespace

std::string resolveListenAddress(const std::string& interfaceName) {
  auto [error, address] = interfaceName.empty()
      ? tensorpipe::transport::uv::lookupAddrLikeNccl()
      : tensorpipe::transport::uv::lookupAddrForIface(interfaceName);
  TORCH_CHECK(
      !error,
      "fairring: cannot find an address to listen on ",
      interfaceName.empty() ? std::string("(automatic choice)")
                            : "for interface '" + interfaceName + "'",
      ": ",
      error.what(),
      "; set TP_SOCKET_IFNAME to an interface that has an address");
  return address;
}

TensorpipeMesh::TensorpipeMesh(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::string& storePrefix,
    const Topology& topology,
    const std::string& listenAddress,
    c10::Device device,
    bool allowInfiniband,
    std::chrono::milliseconds timeout)
    : topology_(topology), connections_(topology.numMachines()) {
  TORCH_CHECK(
      topology_.regular(),
      "fairring: rails need every machine to hold equally many ranks");
  const int rank = topology_.rank();
  const tensorpipe::Device ownDevice = tensorpipeDevice(device);
  context_ = std::make_shared<tensorpipe::Context>(
      tensorpipe::ContextOptions().name("fairring-rank-" + std::to_string(rank)));
  std::vector<std::string> listenUrls{"uv://" + listenAddress};
  context_->registerTransport(0, "uv", tensorpipe::transport::uv::create());
  transports_ = "transports uv";
  auto infiniband =
      allowInfiniband ? tensorpipe::transport::ibv::create() : nullptr;
  if (infiniband && infiniband->isViable()) {
    // Peers connect over TCP first; TensorPipe moves to the better transport
    // when both ends offer it.
    context_->registerTransport(10, "ibv", infiniband);
    listenUrls.push_back("ibv://" + listenAddress);
    transports_ = "transports ibv, uv";
  }
  context_->registerChannel(0, "basic", tensorpipe::channel::basic::create());
  transports_ += "; channels basic";
  if (device.is_cuda()) {
    transports_ += ", " + registerCudaChannels(*context_, allowInfiniband);
  }

  listener_ = context_->listen(listenUrls);
  url_ = listener_->url("uv");
  // "<device index> <url>": what a connecting peer needs to know.
  const std::string published = std::to_string(ownDevice.index) + " " + url_;
  store->set(
      storePrefix + "url/" + std::to_string(rank),
      std::vector<uint8_t>(published.begin(), published.end()));

  // Peers on lower machines connect to us, one pipe per lane.
  auto accepted = std::make_shared<Accepted>();
  const int expected = topology_.machine() * kLanes;
  acceptNext(listener_, accepted, expected);

  auto writeError = std::make_shared<std::pair<std::mutex, std::string>>();
  for (int machine = topology_.machine() + 1; machine < topology_.numMachines();
       ++machine) {
    const int peer = peerRank(machine);
    const auto bytes = store->get(storePrefix + "url/" + std::to_string(peer));
    std::istringstream peerRecord(std::string(bytes.begin(), bytes.end()));
    int peerDeviceIndex = -1;
    std::string peerUrl;
    peerRecord >> peerDeviceIndex >> peerUrl;
    TORCH_CHECK(
        peerDeviceIndex >= 0 && !peerUrl.empty(),
        "fairring: rank ",
        rank,
        ": rails mesh: rank ",
        peer,
        " published a malformed address '",
        std::string(bytes.begin(), bytes.end()),
        "' (are all ranks running the same fairring?)");
    for (int lane = 0; lane < kLanes; ++lane) {
      auto pipe = context_->connect(peerUrl);
      tensorpipe::Message hello;
      hello.metadata =
          helloMetadata(rank, static_cast<Lane>(lane), ownDevice.index);
      pipe->write(
          std::move(hello), [writeError, peer](const tensorpipe::Error& error) {
            if (error) {
              std::lock_guard<std::mutex> lock(writeError->first);
              writeError->second = "connecting to rail peer rank " +
                  std::to_string(peer) + ": " + error.what();
            }
          });
      connections_[machine][lane] = std::make_unique<TensorpipeConnection>(
          std::move(pipe),
          tensorpipe::Device{ownDevice.type, peerDeviceIndex});
    }
  }

  std::unique_lock<std::mutex> lock(accepted->mutex);
  const bool complete = accepted->changed.wait_for(lock, timeout, [&] {
    return !accepted->error.empty() ||
        static_cast<int>(accepted->pipes.size()) == expected;
  });
  std::string failure = accepted->error;
  if (failure.empty() && !complete) {
    std::ostringstream missing;
    for (int machine = 0; machine < topology_.machine(); ++machine) {
      int lanes = 0;
      for (const auto& entry : accepted->pipes) {
        lanes += entry.rank == peerRank(machine);
      }
      if (lanes < kLanes) {
        missing << " " << peerRank(machine);
      }
    }
    failure = "timed out after " + std::to_string(timeout.count()) +
        " ms waiting for rail peer rank(s)" + missing.str() +
        " to connect to " + url_;
  }
  for (const auto& entry : accepted->pipes) {
    for (int machine = 0; machine < topology_.machine(); ++machine) {
      if (peerRank(machine) == entry.rank) {
        connections_[machine][entry.lane] =
            std::make_unique<TensorpipeConnection>(
                entry.pipe,
                tensorpipe::Device{ownDevice.type, entry.deviceIndex});
      }
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
}

TensorpipeMesh::~TensorpipeMesh() {
  shutdown();
}

void TensorpipeMesh::shutdown() {
  context_->close();
  context_->join();
}

void TensorpipeMesh::close() {
  for (const auto& lanes : connections_) {
    for (const auto& connection : lanes) {
      if (connection) {
        connection->close();
      }
    }
  }
}

Connection& TensorpipeMesh::connection(int machine, Lane lane) {
  const auto& connection = connections_.at(machine)[lane];
  TORCH_CHECK(connection, "fairring: no rail connection to machine ", machine);
  return *connection;
}

} // namespace fairring::rails
