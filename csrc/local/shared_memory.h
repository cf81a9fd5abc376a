#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "local/local_steps.h"

namespace fairring {

// The local steps of CPU all-reduces through shared memory: the ranks of one
// machine exchange and reduce their slots in each other's memory instead of
// over loopback TCP (the role NVLink plays for GPUs).
//
// Each rank owns one POSIX shared-memory segment, which only it writes and
// its local peers map read-only. The segment holds one channel per step
// (reduce-scatter, all-gather); a channel is a ring of kDepth entries and two
// counters, the chunks this rank has published (written into its ring) and
// consumed (read from every peer's ring). A step cuts its data into chunks:
// chunk n goes into entry n mod kDepth once every peer has consumed chunk
// n - kDepth, and is published with a release store; a reader that sees the
// count with an acquire load reads the entry. Counters are futex words: a
// waiter spins briefly, then sleeps until the owner's wake, its deadline, or
// abort(). Each entry carries its chunk number and the slice's key, so ranks
// that issued different all-reduces fail instead of reducing each other's
// unrelated data.
//
// Bounded: kDepth entries of kEntryBytes per channel, whatever the slice
// size, allocated (posix_fallocate) at construction, so a /dev/shm too small
// fails here, with the reason, and not with SIGBUS on first touch.
//
// Threads: the reduce-scatter stage calls reduceScatter and the all-gather
// stage allGather, each in slice order (the same on every rank, c10d's rule)
// and each on its own channel; abort() from any thread.
class SharedMemorySteps final : public LocalSteps {
 public:
  // Measured on 2 x 2 loopback (docs/benchmarks.md, "Shared memory"): chunks
  // of a few hundred KiB stay in cache between writer and reader; 4 in flight
  // let the faster rank run ahead without waiting.
  static constexpr int64_t kEntryBytes = 512 * 1024;
  static constexpr int kDepth = 4;
  static constexpr int kChannels = 2;

  // This rank's segment, created and allocated; `ranks`: the machine's
  // ranks by local index, for errors.
  SharedMemorySteps(int localRank, std::vector<int> ranks);
  ~SharedMemorySteps() override;
  SharedMemorySteps(const SharedMemorySteps&) = delete;
  SharedMemorySteps& operator=(const SharedMemorySteps&) = delete;

  // The segment's name, which peers pass to attach().
  const std::string& segmentName() const {
    return segmentName_;
  }
  // Maps every peer's segment (`names` by local index; this rank's is
  // skipped) and checks its layout. Throws, saying why, if one cannot be.
  void attach(const std::vector<std::string>& names);
  // Removes this rank's name from /dev/shm, once every peer has mapped it:
  // the memory lives as long as a mapping does, and nothing is left behind
  // if a process dies.
  void unlink();
  // Bytes of shared memory each rank's segment takes.
  static int64_t segmentBytes();

  // LocalSteps; `input`, `slot` and `output` contiguous, `parts` unused:
  // each peer's part is read where the peer published it.
  void reduceScatter(
      at::Tensor& slot,
      at::Tensor& parts,
      const at::Tensor& input,
      c10d::ReduceOp::RedOpType op,
      const LocalStepKey& key,
      Clock::time_point deadline) override;
  void allGather(
      at::Tensor& output,
      const at::Tensor& slot,
      const LocalStepKey& key,
      Clock::time_point deadline) override;
  // Each peer's part read where it published it, its own from `slot`,
  // straight to `place`: no gathered copy.
  bool placesParts() const override {
    return true;
  }
  void allGatherPlaced(
      const at::Tensor& slot,
      const Place& place,
      const LocalStepKey& key,
      Clock::time_point deadline) override;
  std::string name() const override {
    return "shared memory";
  }
  void abort() override;

 private:
  struct Mapping; // one segment mapped into this process
  struct Channel; // a channel's place in a segment
  struct EntryHeader;

  Channel channel(const Mapping& mapping, int index) const;
  static EntryHeader headerFor(const LocalStepKey& key, int64_t stepBytes);
  // Blocks until `counter` (a peer's) reaches `target`; throws on abort or
  // at `deadline`, naming `peer` and what was awaited.
  void waitFor(
      const std::atomic<uint32_t>& counter,
      uint64_t target,
      int peer,
      const char* what,
      Clock::time_point deadline) const;
  // Publishes chunk `n` of channel `index`, after `fill` wrote its data.
  template <typename Fill>
  void publish(
      int index,
      uint64_t n,
      const EntryHeader& header,
      Clock::time_point deadline,
      Fill&& fill);
  // Waits for peer `peer`'s chunk `n` of channel `index`, checks it against
  // `expected`, and returns its data.
  const std::byte* await(
      int index,
      int peer,
      uint64_t n,
      const EntryHeader& expected,
      Clock::time_point deadline) const;
  void consumed(int index, uint64_t n);

  const int localRank_;
  const std::vector<int> ranks_;
  std::string segmentName_;
  bool linked_ = false;
  std::vector<Mapping> mappings_; // by local rank; this rank's is writable
  // Chunks this rank has gone through, per channel; only that channel's
  // stage thread touches its count.
  std::array<uint64_t, kChannels> chunks_{};
  std::atomic<bool> aborted_{false};
};

} // namespace fairring
