#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/tensorpipe/acceptor.h"

#include <limits>

#include <c10/core/Device.h>
#include <tensorpipe/tensorpipe.h>

namespace fairring::rails {

namespace {

// Rejected pipes noted for a timeout's error; later ones are only counted.
constexpr size_t kRejectionsNoted = 8;

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

} // namespace

bool plausibleDeviceIndex(int index, bool cuda) {
  return cuda
      ? index >= 0 && index <= std::numeric_limits<c10::DeviceIndex>::max()
      : index == 0;
}

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

void Accepted::reject(
    const std::shared_ptr<tensorpipe::Pipe>& pipe, std::string why) {
  pipe->close();
  std::lock_guard<std::mutex> lock(mutex);
  if (rejections.size() < kRejectionsNoted) {
    rejections.push_back(std::move(why));
  }
  ++rejected;
}

std::string Accepted::noted() const {
  std::string text = "rejected " + std::to_string(rejected) + " connection(s):";
  for (const auto& why : rejections) {
    text += " [" + why + "]";
  }
  return text;
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

} // namespace fairring::rails
