#include <torch_headers.h> // first: the precompiled torch headers

// A rail switch on TensorPipe (rails/failover.h): a rail peer's pipes closed
// (detach), new ones made through another of this machine's interfaces,
// the lower machine's rank listening for that one switch and the higher one
// dialling, each side's received counts exchanged in the hellos and the
// listener's record, then the new connections installed in the slots.

#include "rails/tensorpipe/mesh.h"

#include <algorithm>
#include <condition_variable>
#include <thread>
#include <utility>

#include <c10/util/Exception.h>
#include <tensorpipe/tensorpipe.h>

#include "rails/peer_text.h"
#include "rails/tensorpipe/acceptor.h"
#include "rails/tensorpipe/connection.h"
#include "rails/tensorpipe/dial_handshakes.h"
#include "rails/tensorpipe/wire.h"

namespace fairring::rails {

std::unique_ptr<TensorpipeConnection> TensorpipeMesh::connectionTo(
    const std::shared_ptr<tensorpipe::Pipe>& pipe,
    int deviceIndex,
    const std::string& session,
    bool dialler) const {
  return std::make_unique<TensorpipeConnection>(
      pipe,
      ownDevice_,
      tensorpipe::Device{ownDevice_.type, deviceIndex},
      encrypt_ ? std::make_unique<PipeCipher>(session, dialler) : nullptr);
}

void TensorpipeMesh::detach(int machine) {
  slots_.apply(
      ConnectionSlots::Event::kDetach,
      machine,
      neighbourIndex(peerRank(machine)));
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
      },
      key_,
      listenerName(
          "for rail switch " + std::to_string(generation) + " on " + address));
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
  accepted->closeUnsettled();
  lock.lock();
  Switched switched;
  switched.pipes.resize(kLanes + 1);
  switched.sessions.resize(kLanes + 1);
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
    switched.sessions[entry.hello.lane] = entry.session;
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
  Switched switched;
  switched.peerReceived = record->received;
  switched.peerDevice = record->deviceIndex;
  switched.dialled = true;
  DialHandshakes handshakes;
  for (int lane = 0; lane <= kControlLane; ++lane) {
    auto pipe = context_->connect(record->url);
    handshakes.dial(
        pipe,
        encode(
            Hello{
                topology_.rank(),
                lane,
                ownDevice_.index,
                call.generation,
                call.received}),
        key_,
        peer,
        record->url);
    switched.pipes.push_back(std::move(pipe));
  }
  const std::string failure = handshakes.wait(call.deadline, call.cancelled);
  if (!failure.empty()) {
    for (const auto& pipe : switched.pipes) {
      pipe->close();
    }
    TORCH_CHECK(false, "rail switch ", call.generation, ": ", failure);
  }
  for (size_t lane = 0; lane < switched.pipes.size(); ++lane) {
    switched.sessions.push_back(handshakes.session(lane));
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
  for (size_t lane = 0; lane < switched.pipes.size(); ++lane) {
    made.push_back(connectionTo(
        switched.pipes[lane],
        switched.peerDevice,
        switched.sessions[lane],
        switched.dialled));
  }
  slots_.apply(
      ConnectionSlots::Event::kInstall,
      machine,
      neighbourIndex(peerRank(machine)),
      std::move(made));
  return switched.peerReceived;
}

} // namespace fairring::rails
