#include <torch_headers.h> // first: the precompiled torch headers

#include "testing/fake_nixl_pair.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "rails/mesh_site.h"
#include "rails/nixl/mesh.h"
#include "testing/fake_nixl.h"

namespace fairring::testing {

FakeNixlPair::FakeNixlPair(
    size_t stagingBytes, int slowReceiverMs, bool ungrantedWrites)
    : store_(c10::make_intrusive<c10d::HashStore>()) {
  TORCH_CHECK(
      fake_nixl::agents().empty(),
      "fairring: one FakeNixlPair at a time (the fake NIXL is process-wide)");
  network_.transport = "nixl";
  rails::nixl::TestKnobs knobs;
  knobs.slowReceiver = std::chrono::milliseconds(slowReceiverMs);
  knobs.ungrantedWrites = ungrantedWrites;
  for (int rank = 0; rank < 2; ++rank) {
    topologies_.emplace_back(rank, std::vector<std::vector<int>>{{0}, {1}});
    staging_.emplace_back(stagingBytes);
  }
  for (int rank = 0; rank < 2; ++rank) {
    const rails::MeshSite site{
        store_,
        "fake/",
        topologies_[rank],
        network_,
        c10::Device(c10::kCPU),
        std::chrono::milliseconds(5000)};
    meshes_.push_back(
        std::make_unique<rails::nixl::NixlMesh>(site, fake_nixl::api(), knobs));
  }
  // Each waits in the store for the other's staging record; a failure on
  // the other thread is rethrown here.
  std::exception_ptr failed;
  std::thread other([this, &failed] {
    try {
      meshes_[1]->registerStaging(slice(1, 0, staging_[1].size()));
    } catch (...) {
      failed = std::current_exception();
    }
  });
  try {
    meshes_[0]->registerStaging(slice(0, 0, staging_[0].size()));
  } catch (...) {
    other.join();
    throw;
  }
  other.join();
  if (failed) {
    std::rethrow_exception(failed);
  }
}

FakeNixlPair::~FakeNixlPair() {
  shutdown();
}

void FakeNixlPair::shutdown() {
  if (meshes_.empty()) {
    return;
  }
  for (auto& mesh : meshes_) {
    mesh->shutdown();
  }
  meshes_.clear();
  fake_nixl::reset();
}

rails::Buffer FakeNixlPair::slice(int rank, size_t offset, size_t bytes) {
  TORCH_CHECK(
      offset <= staging_.at(rank).size() &&
          bytes <= staging_[rank].size() - offset,
      "fairring: outside the fake staging");
  return rails::Buffer{staging_[rank].data() + offset, bytes};
}

std::string FakeNixlPair::agent(int rank) const {
  const std::string prefix = "fairring-rank" + std::to_string(rank) + "-";
  for (const auto& name : fake_nixl::agents()) {
    if (name.rfind(prefix, 0) == 0) {
      return name;
    }
  }
  return "";
}

uint64_t FakeNixlPair::stagingAddress(int rank) const {
  return reinterpret_cast<uintptr_t>(staging_.at(rank).data());
}

std::shared_ptr<FakeNixlPair::Outcome> FakeNixlPair::start(int& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  id = nextId_++;
  return ops_[id] = std::make_shared<Outcome>();
}

void FakeNixlPair::finish(
    const std::shared_ptr<Outcome>& outcome, Outcome result) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    *outcome = std::move(result);
    outcome->finished = true;
  }
  finished_.notify_all();
}

int FakeNixlPair::send(
    int rank, std::string tag, size_t offset, size_t bytes, int fill) {
  const rails::Buffer buffer = slice(rank, offset, bytes);
  std::memset(buffer.data, fill, bytes);
  int id = 0;
  auto outcome = start(id);
  meshes_.at(rank)
      ->connection(1 - rank, rails::kShards)
      .write(std::move(tag), buffer, [this, outcome](const std::string& error) {
        finish(outcome, Outcome{true, error});
      });
  return id;
}

int FakeNixlPair::receive(
    int rank, std::string tag, size_t offset, size_t bytes) {
  const rails::Buffer target = slice(rank, offset, bytes);
  int id = 0;
  auto outcome = start(id);
  meshes_.at(rank)
      ->connection(1 - rank, rails::kShards)
      .read(
          std::move(tag),
          target,
          [this, outcome, target](
              const std::string& error, std::string tag, size_t bytes) {
            const char* data = static_cast<const char*>(target.data);
            finish(
                outcome,
                Outcome{
                    true,
                    error,
                    std::move(tag),
                    bytes,
                    error.empty() ? std::string(data, target.bytes) : ""});
          });
  return id;
}

int FakeNixlPair::sendNote(int rank, std::string text) {
  int id = 0;
  auto outcome = start(id);
  meshes_.at(rank)->control(0).writeNote(
      std::move(text), [this, outcome](const std::string& error) {
        finish(outcome, Outcome{true, error});
      });
  return id;
}

int FakeNixlPair::readNote(int rank) {
  int id = 0;
  auto outcome = start(id);
  meshes_.at(rank)->control(0).readNote(
      [this, outcome](const std::string& error, std::string text) {
        finish(outcome, Outcome{true, error, std::move(text)});
      });
  return id;
}

FakeNixlPair::Outcome FakeNixlPair::wait(int id, double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto outcome = ops_.at(id);
  finished_.wait_for(lock, std::chrono::duration<double>(seconds), [&] {
    return outcome->finished;
  });
  return *outcome;
}

bool FakeNixlPair::inject(
    const std::string& from, int rank, const std::string& bytes) {
  return fake_nixl::inject(from, agent(rank), bytes);
}

std::string FakeNixlPair::describe(int rank) const {
  TORCH_CHECK(!meshes_.empty(), "fairring: the fake pair was shut down");
  return meshes_.at(rank)->describe();
}

} // namespace fairring::testing
