#include <torch_headers.h> // first: the precompiled torch headers

#include "rails/tensorpipe/acceptor.h"

#include <limits>

#include <c10/core/Device.h>
#include <tensorpipe/tensorpipe.h>

#include "log.h"
#include "rails/peer_text.h"
#include "rails/tensorpipe/handshake.h"

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
          // A lane already proven is refused at once; one still open is
          // claimed only with the proof (admitProven).
          std::lock_guard<std::mutex> lock(accepted->mutex);
          if (accepted->seen.contains({hello.rank, hello.lane})) {
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
            [pipe, accepted, hello, text = std::move(descriptor.metadata)](
                const tensorpipe::Error& error) mutable {
              if (error) {
                accepted->reject(
                    pipe,
                    "reading the hello of rank " + std::to_string(hello.rank) +
                        ": " + error.what());
                return;
              }
              // Claiming a lane takes the proof, so a forger's hello cannot
              // take the real peer's place or keep it out.
              challengeDialler(
                  pipe,
                  std::move(text),
                  accepted->key,
                  [pipe, accepted, hello](
                      const std::string& why, const std::string& session) {
                    accepted->admitProven(pipe, hello, why, session);
                  });
            });
      });
}

} // namespace

void Accepted::admitProven(
    const std::shared_ptr<tensorpipe::Pipe>& pipe,
    const Hello& hello,
    const std::string& why,
    const std::string& session) {
  const std::string claimed = "rank " + std::to_string(hello.rank) +
      " on lane " + std::to_string(hello.lane);
  if (!why.empty()) {
    reject(pipe, "a hello from " + claimed + " without its proof: " + why);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (seen.emplace(hello.rank, hello.lane).second) {
      std::erase(unsettled, pipe);
      pipes.push_back({hello, pipe, session});
      changed.notify_all();
      return;
    }
  }
  reject(pipe, "a second hello from " + claimed);
}

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
  bool noted = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    std::erase(unsettled, pipe);
    noted = rejections.size() < kRejectionsNoted && !ended;
    if (noted) {
      rejections.push_back(why);
    }
    ++rejected;
  }
  // Logged once each, the first few: a flood of strangers is only counted.
  // TensorPipe gives no accepted pipe's address; its name is the peer's word.
  if (noted) {
    notice(
        LogLevel::kWarning,
        "fairring: " + where + " refused a connection (TensorPipe name '" +
            printable(pipe->getRemoteName(), 60) + "'): " + why +
            "; the job goes on");
  }
}

void Accepted::closeUnsettled() {
  std::vector<std::shared_ptr<tensorpipe::Pipe>> closing;
  {
    std::lock_guard<std::mutex> lock(mutex);
    ended = true;
    closing.swap(unsettled);
  }
  // Their callbacks run with errors, here or on the loop thread, and lock.
  for (const auto& pipe : closing) {
    pipe->close();
  }
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
    {
      std::lock_guard<std::mutex> lock(accepted->mutex);
      accepted->unsettled.push_back(pipe);
    }
    admit(pipe, accepted);
    acceptForever(listener, accepted);
  });
}

} // namespace fairring::rails
