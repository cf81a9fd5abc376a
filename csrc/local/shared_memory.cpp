#include <torch_headers.h> // first: the precompiled torch headers

#include "local/shared_memory.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include "reduction.h"

namespace fairring {

namespace {

constexpr uint64_t kMagic = 0x676e697272696166; // "fairring", little-endian
constexpr uint32_t kVersion = 1;
constexpr int64_t kLine = 64;
// Before sleeping, a waiter checks this often: a peer a few microseconds
// behind costs no system call, and one further behind costs no CPU.
constexpr int kSpins = 200;
// A sleeping waiter looks at abort() and its deadline at least this often.
constexpr std::chrono::milliseconds kLongestSleep{20};

enum ChannelIndex : int { kReduceScatterChannel = 0, kAllGatherChannel = 1 };

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(SharedMemorySteps::kEntryBytes % kLine == 0);

struct alignas(kLine) SegmentHeader {
  uint64_t magic;
  uint32_t version;
  int32_t localRank;
  int64_t entryBytes;
  int32_t depth;
  int32_t channels;
};

// A channel: two counters, each on its own cache line, then the entries.
constexpr int64_t kControlBytes = 2 * kLine;
constexpr int64_t kEntryStride = kLine + SharedMemorySteps::kEntryBytes;
constexpr int64_t kChannelBytes =
    kControlBytes + SharedMemorySteps::kDepth * kEntryStride;

// Whether a 32-bit counter that wraps has reached `target` (mod 2^32).
bool reached(uint32_t value, uint64_t target) {
  return static_cast<int32_t>(value - static_cast<uint32_t>(target)) >= 0;
}

// Shared (not process-private) futexes: the words are in shared memory.
void futexWait(
    const std::atomic<uint32_t>& word,
    uint32_t expected,
    std::chrono::nanoseconds timeout) {
  const auto seconds = std::chrono::floor<std::chrono::seconds>(timeout);
  timespec relative{
      static_cast<time_t>(seconds.count()),
      static_cast<long>((timeout - seconds).count())};
  // EAGAIN (it changed), EINTR and ETIMEDOUT all mean: look again.
  syscall(SYS_futex, &word, FUTEX_WAIT, expected, &relative, nullptr, 0);
}

void futexWake(const std::atomic<uint32_t>& word) {
  syscall(SYS_futex, &word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::string errnoText(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

// A file descriptor, closed when it goes.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const {
    return fd_;
  }

 private:
  int fd_;
};

std::string uniqueName() {
  std::random_device random;
  const uint64_t token =
      (static_cast<uint64_t>(random()) << 32) ^ static_cast<uint64_t>(random());
  char text[17];
  std::snprintf(
      text, sizeof(text), "%016llx", static_cast<unsigned long long>(token));
  return "/fairring-" + std::to_string(::getpid()) + "-" + text;
}

std::string shmSpaceText() {
  struct statvfs stats{};
  if (::statvfs("/dev/shm", &stats) != 0) {
    return "";
  }
  const auto mib = [](uint64_t bytes) {
    return std::to_string(bytes >> 20) + " MiB";
  };
  return " (/dev/shm: " + mib(stats.f_bavail * stats.f_frsize) + " free of " +
      mib(stats.f_blocks * stats.f_frsize) + ")";
}

std::string describeKey(const LocalStepKey& key, uint64_t stepBytes) {
  return "all_reduce #" + std::to_string(key.collective) + " slice " +
      std::to_string(key.slice) + " (" + std::to_string(stepBytes) +
      " bytes of " + c10::toString(key.dtype) + ", " + reduceOpName(key.op) +
      ")";
}

} // namespace

struct SharedMemorySteps::EntryHeader {
  uint64_t chunk;
  uint64_t seq;
  uint64_t slice;
  uint64_t stepBytes; // the slot's bytes: the step's size
  int32_t dtype;
  int32_t op;
  uint64_t collective; // for errors only

  bool sameStep(const EntryHeader& other) const {
    return chunk == other.chunk && seq == other.seq && slice == other.slice &&
        stepBytes == other.stepBytes && dtype == other.dtype && op == other.op;
  }
};

struct SharedMemorySteps::Mapping {
  std::byte* base = nullptr;
  size_t bytes = 0;

  Mapping() = default;
  Mapping(std::byte* base_, size_t bytes_) : base(base_), bytes(bytes_) {}
  Mapping(Mapping&& other) noexcept
      : base(std::exchange(other.base, nullptr)), bytes(other.bytes) {}
  Mapping& operator=(Mapping&& other) noexcept {
    Mapping old(std::move(*this));
    base = std::exchange(other.base, nullptr);
    bytes = other.bytes;
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base != nullptr) {
      ::munmap(base, bytes);
    }
  }
};

struct SharedMemorySteps::Channel {
  std::atomic<uint32_t>* published;
  std::atomic<uint32_t>* consumed;
  std::byte* entries;

  EntryHeader* header(uint64_t n) const {
    return reinterpret_cast<EntryHeader*>(
        entries + (n % kDepth) * kEntryStride);
  }
  std::byte* data(uint64_t n) const {
    return entries + (n % kDepth) * kEntryStride + kLine;
  }
};

int64_t SharedMemorySteps::segmentBytes() {
  static_assert(sizeof(EntryHeader) <= kLine);
  return kLine + kChannels * kChannelBytes;
}

SharedMemorySteps::SharedMemorySteps(int localRank, std::vector<int> ranks)
    : localRank_(localRank), ranks_(std::move(ranks)) {
  TORCH_CHECK(
      localRank_ >= 0 && localRank_ < static_cast<int>(ranks_.size()) &&
          ranks_.size() > 1,
      "fairring: shared-memory local steps for local rank ",
      localRank_,
      " of ",
      ranks_.size(),
      ": they need two or more local ranks and a local rank among them; a "
      "fairring bug: please report it");
  mappings_.resize(ranks_.size());
  segmentName_ = uniqueName();
  const Descriptor fd(
      ::shm_open(
          segmentName_.c_str(), O_CREAT | O_EXCL | O_RDWR, S_IRUSR | S_IWUSR));
  if (fd.get() < 0) {
    throw std::runtime_error(
        errnoText("shm_open(" + segmentName_ + ") failed"));
  }
  linked_ = true;
  const auto bytes = static_cast<size_t>(segmentBytes());
  // Reserves the pages now: tmpfs would otherwise grant them on first touch,
  // and a full /dev/shm would then kill the process with SIGBUS.
  if (const int error = ::posix_fallocate(fd.get(), 0, bytes); error != 0) {
    unlink();
    throw std::runtime_error(
        "cannot allocate " + std::to_string(bytes) + " bytes of shared memory" +
        shmSpaceText() + ": " + std::strerror(error));
  }
  void* base = ::mmap(
      nullptr,
      bytes,
      PROT_READ | PROT_WRITE,
      MAP_SHARED | MAP_POPULATE,
      fd.get(),
      0);
  if (base == MAP_FAILED) {
    const std::string error = errnoText("mmap of " + segmentName_ + " failed");
    unlink();
    throw std::runtime_error(error);
  }
  Mapping& mine = mappings_[localRank_] =
      Mapping(static_cast<std::byte*>(base), bytes);
  // The memory is zeroed: every counter starts at 0.
  auto* header = std::construct_at(reinterpret_cast<SegmentHeader*>(mine.base));
  header->magic = kMagic;
  header->version = kVersion;
  header->localRank = localRank_;
  header->entryBytes = kEntryBytes;
  header->depth = kDepth;
  header->channels = kChannels;
  for (int index = 0; index < kChannels; ++index) {
    std::byte* control = mine.base + kLine + index * kChannelBytes;
    std::construct_at(reinterpret_cast<std::atomic<uint32_t>*>(control), 0u);
    std::construct_at(
        reinterpret_cast<std::atomic<uint32_t>*>(control + kLine), 0u);
  }
}

SharedMemorySteps::~SharedMemorySteps() {
  unlink();
}

void SharedMemorySteps::unlink() {
  if (linked_) {
    ::shm_unlink(segmentName_.c_str());
    linked_ = false;
  }
}

void SharedMemorySteps::attach(const std::vector<std::string>& names) {
  TORCH_CHECK(
      names.size() == ranks_.size(),
      "fairring: shared-memory local steps: ",
      names.size(),
      " segment names for ",
      ranks_.size(),
      " local ranks; a fairring bug: please report it");
  for (int peer = 0; peer < static_cast<int>(names.size()); ++peer) {
    if (peer == localRank_) {
      continue;
    }
    const std::string whose = "rank " + std::to_string(ranks_[peer]) +
        "'s shared memory " + names[peer];
    const Descriptor fd(::shm_open(names[peer].c_str(), O_RDONLY, 0));
    if (fd.get() < 0) {
      throw std::runtime_error(errnoText(
          "cannot open " + whose +
          " (ranks on one machine must share /dev/shm and a user)"));
    }
    struct stat stats{};
    const auto bytes = static_cast<size_t>(segmentBytes());
    if (::fstat(fd.get(), &stats) != 0) {
      throw std::runtime_error(errnoText("cannot stat " + whose));
    }
    // A peer's segment is made by this user, for this user only (mode 0600):
    // one another user made, or may write, could feed the reductions.
    if (stats.st_uid != ::geteuid() || (stats.st_mode & 077) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof(mode), "%04o", stats.st_mode & 07777);
      throw std::runtime_error(
          whose + " belongs to uid " + std::to_string(stats.st_uid) +
          " with mode " + mode + "; fairring maps only segments of its own " +
          "user (uid " + std::to_string(::geteuid()) +
          ") that no other user may open");
    }
    if (static_cast<size_t>(stats.st_size) != bytes) {
      throw std::runtime_error(
          whose + " has " + std::to_string(stats.st_size) + " bytes, not " +
          std::to_string(bytes) + " (a different fairring build?)");
    }
    void* base = ::mmap(
        nullptr, bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
    if (base == MAP_FAILED) {
      throw std::runtime_error(errnoText("mmap of " + whose + " failed"));
    }
    mappings_[peer] = Mapping(static_cast<std::byte*>(base), bytes);
    const auto* header = reinterpret_cast<const SegmentHeader*>(base);
    if (header->magic != kMagic || header->version != kVersion ||
        header->localRank != peer || header->entryBytes != kEntryBytes ||
        header->depth != kDepth || header->channels != kChannels) {
      throw std::runtime_error(
          whose + " has another layout (a different fairring build?)");
    }
  }
}

SharedMemorySteps::Channel SharedMemorySteps::channel(
    const Mapping& mapping, int index) const {
  std::byte* control = mapping.base + kLine + index * kChannelBytes;
  return Channel{
      reinterpret_cast<std::atomic<uint32_t>*>(control),
      reinterpret_cast<std::atomic<uint32_t>*>(control + kLine),
      control + kControlBytes};
}

void SharedMemorySteps::waitFor(
    const std::atomic<uint32_t>& counter,
    uint64_t target,
    int peer,
    const char* what,
    Clock::time_point deadline) const {
  for (int spin = 0; spin < kSpins; ++spin) {
    if (reached(counter.load(std::memory_order_acquire), target)) {
      return;
    }
    cpuRelax();
  }
  while (true) {
    const uint32_t seen = counter.load(std::memory_order_acquire);
    if (reached(seen, target)) {
      return;
    }
    TORCH_CHECK(
        !aborted_.load(), "the engine stopped while the step was in flight");
    const auto now = Clock::now();
    TORCH_CHECK(
        now < deadline,
        "timed out waiting for rank ",
        ranks_[peer],
        " of this machine ",
        what,
        " (shared memory, chunk ",
        target - 1,
        ")");
    futexWait(
        counter,
        seen,
        std::min<Clock::duration>(deadline - now, kLongestSleep));
  }
}

template <typename Fill>
void SharedMemorySteps::publish(
    int index,
    uint64_t n,
    const EntryHeader& header,
    Clock::time_point deadline,
    Fill&& fill) {
  const Channel mine = channel(mappings_[localRank_], index);
  // Entry n mod kDepth last held chunk n - kDepth: every peer must be done
  // with it. The writer waits here only for a peer kDepth chunks behind.
  if (n >= static_cast<uint64_t>(kDepth)) {
    for (int peer = 0; peer < static_cast<int>(ranks_.size()); ++peer) {
      if (peer != localRank_) {
        waitFor(
            *channel(mappings_[peer], index).consumed,
            n - kDepth + 1,
            peer,
            "to finish reading an earlier part",
            deadline);
      }
    }
  }
  fill(mine.data(n));
  EntryHeader* slot = mine.header(n);
  *slot = header;
  slot->chunk = n;
  mine.published->store(
      static_cast<uint32_t>(n + 1), std::memory_order_release);
  futexWake(*mine.published);
}

const std::byte* SharedMemorySteps::await(
    int index,
    int peer,
    uint64_t n,
    const EntryHeader& expected,
    Clock::time_point deadline) const {
  const Channel theirs = channel(mappings_[peer], index);
  waitFor(*theirs.published, n + 1, peer, "to publish its part", deadline);
  EntryHeader found{};
  std::memcpy(&found, theirs.header(n), sizeof(found));
  EntryHeader wanted = expected;
  wanted.chunk = n;
  if (!found.sameStep(wanted)) {
    const auto describe = [](const EntryHeader& h) {
      LocalStepKey key;
      key.seq = h.seq;
      key.collective = h.collective;
      key.slice = h.slice;
      key.dtype = static_cast<c10::ScalarType>(h.dtype);
      key.op = static_cast<c10d::ReduceOp::RedOpType>(h.op);
      return describeKey(key, h.stepBytes) + ", chunk " +
          std::to_string(h.chunk);
    };
    TORCH_CHECK(
        false,
        "the ranks of this machine issued different all-reduces: rank ",
        ranks_[peer],
        " sent ",
        describe(found),
        " where rank ",
        ranks_[localRank_],
        " expected ",
        describe(wanted));
  }
  return theirs.data(n);
}

void SharedMemorySteps::consumed(int index, uint64_t n) {
  const Channel mine = channel(mappings_[localRank_], index);
  mine.consumed->store(static_cast<uint32_t>(n + 1), std::memory_order_release);
  futexWake(*mine.consumed);
}

SharedMemorySteps::EntryHeader SharedMemorySteps::headerFor(
    const LocalStepKey& key, int64_t stepBytes) {
  EntryHeader header{};
  header.seq = key.seq;
  header.slice = key.slice;
  header.stepBytes = static_cast<uint64_t>(stepBytes);
  header.dtype = static_cast<int32_t>(key.dtype);
  header.op = static_cast<int32_t>(key.op);
  header.collective = key.collective;
  return header;
}

void SharedMemorySteps::reduceScatter(
    at::Tensor& slot,
    at::Tensor& /*parts*/,
    const at::Tensor& input,
    c10d::ReduceOp::RedOpType op,
    const LocalStepKey& key,
    Clock::time_point deadline) {
  const int size = static_cast<int>(ranks_.size());
  TORCH_CHECK(
      slot.is_contiguous() && input.is_contiguous() &&
          input.numel() == slot.numel() * size,
      "fairring: shared-memory reduce-scatter of ",
      input.numel(),
      " elements into a slot of ",
      slot.numel(),
      " for ",
      size,
      " local ranks: both must be contiguous and the input the slot times "
      "the ranks; a fairring bug: please report it");
  const int64_t elementSize = slot.element_size();
  const int64_t slotBytes = slot.numel() * elementSize;
  // Each entry holds the same range of every peer's part.
  const int64_t chunkBytes = kEntryBytes / size / kLine * kLine;
  const int64_t chunks =
      std::max<int64_t>(1, (slotBytes + chunkBytes - 1) / chunkBytes);
  const auto* in = static_cast<const std::byte*>(input.data_ptr());
  const EntryHeader header = headerFor(key, slotBytes);
  uint64_t& base = chunks_[kReduceScatterChannel];
  const auto length = [&](int64_t chunk) {
    return std::min(chunkBytes, slotBytes - chunk * chunkBytes);
  };
  const auto write = [&](int64_t chunk) {
    publish(
        kReduceScatterChannel,
        base + chunk,
        header,
        deadline,
        [&](std::byte* data) {
          for (int part = 0; part < size; ++part) {
            if (part != localRank_) {
              std::memcpy(
                  data + part * chunkBytes,
                  in + part * slotBytes + chunk * chunkBytes,
                  length(chunk));
            }
          }
        });
  };
  write(0);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    // One chunk ahead: peers find it published when they come for it.
    if (chunk + 1 < chunks) {
      write(chunk + 1);
    }
    const int64_t offset = chunk * chunkBytes / elementSize;
    const int64_t numel = length(chunk) / elementSize;
    at::Tensor into = slot.narrow(0, offset, numel);
    const at::Tensor own =
        input.narrow(0, localRank_ * slot.numel() + offset, numel);
    bool first = true;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == localRank_) {
        continue;
      }
      const std::byte* data =
          await(kReduceScatterChannel, peer, base + chunk, header, deadline);
      const at::Tensor theirs = at::from_blob(
          const_cast<std::byte*>(data + localRank_ * chunkBytes),
          {numel},
          slot.options());
      if (first) {
        combineOut(into, own, theirs, op); // one pass instead of copy + combine
        first = false;
      } else {
        combineInto(into, theirs, op);
      }
    }
    consumed(kReduceScatterChannel, base + chunk);
  }
  base += chunks;
}

void SharedMemorySteps::allGather(
    at::Tensor& output,
    const at::Tensor& slot,
    const LocalStepKey& key,
    Clock::time_point deadline) {
  const int size = static_cast<int>(ranks_.size());
  TORCH_CHECK(
      slot.is_contiguous() && output.is_contiguous() &&
          output.numel() == slot.numel() * size,
      "fairring: shared-memory all-gather of a slot of ",
      slot.numel(),
      " elements into ",
      output.numel(),
      " for ",
      size,
      " local ranks: both must be contiguous and the output the slot times "
      "the ranks; a fairring bug: please report it");
  const int64_t slotBytes = slot.numel() * slot.element_size();
  auto* out = static_cast<std::byte*>(output.data_ptr());
  allGatherPlaced(
      slot,
      [out, slotBytes](
          int rank, int64_t offset, const std::byte* data, int64_t length) {
        std::memcpy(out + rank * slotBytes + offset, data, length);
      },
      key,
      deadline);
}

void SharedMemorySteps::allGatherPlaced(
    const at::Tensor& slot,
    const Place& place,
    const LocalStepKey& key,
    Clock::time_point deadline) {
  TORCH_CHECK(
      slot.is_contiguous(),
      "fairring: shared-memory all-gather of a slot that is not contiguous; "
      "a fairring bug: please report it");
  const int size = static_cast<int>(ranks_.size());
  const int64_t slotBytes = slot.numel() * slot.element_size();
  const int64_t chunks =
      std::max<int64_t>(1, (slotBytes + kEntryBytes - 1) / kEntryBytes);
  const auto* mine = static_cast<const std::byte*>(slot.data_ptr());
  const EntryHeader header = headerFor(key, slotBytes);
  uint64_t& base = chunks_[kAllGatherChannel];
  const auto length = [&](int64_t chunk) {
    return std::min(kEntryBytes, slotBytes - chunk * kEntryBytes);
  };
  const auto write = [&](int64_t chunk) {
    publish(
        kAllGatherChannel,
        base + chunk,
        header,
        deadline,
        [&](std::byte* data) {
          std::memcpy(data, mine + chunk * kEntryBytes, length(chunk));
        });
  };
  write(0);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    if (chunk + 1 < chunks) {
      write(chunk + 1);
    }
    const int64_t offset = chunk * kEntryBytes;
    place(localRank_, offset, mine + offset, length(chunk));
    for (int peer = 0; peer < size; ++peer) {
      if (peer != localRank_) {
        place(
            peer,
            offset,
            await(kAllGatherChannel, peer, base + chunk, header, deadline),
            length(chunk));
      }
    }
    consumed(kAllGatherChannel, base + chunk);
  }
  base += chunks;
}

void SharedMemorySteps::abort() {
  if (aborted_.exchange(true)) {
    return;
  }
  // Wakes this process's waiters, which sleep on peers' words only.
  for (int peer = 0; peer < static_cast<int>(mappings_.size()); ++peer) {
    if (peer == localRank_ || mappings_[peer].base == nullptr) {
      continue;
    }
    for (int index = 0; index < kChannels; ++index) {
      const Channel theirs = channel(mappings_[peer], index);
      futexWake(*theirs.published);
      futexWake(*theirs.consumed);
    }
  }
}

} // namespace fairring
