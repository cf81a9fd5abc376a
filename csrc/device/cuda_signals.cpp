#include "device/cuda_signals.h"

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include <cuda.h> // the driver's types only: its functions come by entry point
#include <cuda_runtime_api.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "log.h"

namespace fairring {

namespace {

using ModuleLoadData = CUresult (*)(CUmodule*, const void*);
using ModuleGetFunction = CUresult (*)(CUfunction*, CUmodule, const char*);
using LaunchKernel = CUresult (*)(
    CUfunction,
    unsigned,
    unsigned,
    unsigned,
    unsigned,
    unsigned,
    unsigned,
    unsigned,
    CUstream,
    void**,
    void**);

// The wait: one thread that polls a word until it reaches the ticket (the
// comparison of ticketReleased), sleeping 2 us between reads. Written in
// PTX, which the driver compiles for the GPU at hand, so that the build
// needs no nvcc. A kernel rather than cuStreamWaitValue32, which needs the
// device's stream memory operations enabled; either stops the rest of its
// hardware queue while it waits, which the launch order makes safe
// (docs/design.md, "The host never waits").
constexpr const char* kWaitPtx = R"(
.version 7.0
.target sm_70
.address_size 64

.visible .entry fairring_wait_signal(
    .param .u64 fairring_wait_signal_word,
    .param .u32 fairring_wait_signal_ticket
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;

    ld.param.u64 %rd1, [fairring_wait_signal_word];
    ld.param.u32 %r1, [fairring_wait_signal_ticket];
    cvta.to.global.u64 %rd2, %rd1;
$L_poll:
    ld.acquire.sys.global.u32 %r2, [%rd2];
    sub.s32 %r3, %r2, %r1;
    setp.ge.s32 %p1, %r3, 0;
    @%p1 bra.uni $L_released;
    nanosleep.u32 2000;
    bra.uni $L_poll;
$L_released:
    ret;
}
)";

// The driver functions the wait needs, found once through the runtime
// (the extension links no libcuda); all null where one is missing.
struct DriverFunctions {
  ModuleLoadData loadModule = nullptr;
  ModuleGetFunction getFunction = nullptr;
  LaunchKernel launch = nullptr;

  static const DriverFunctions& get() {
    static const DriverFunctions functions = find();
    return functions;
  }

  bool found() const {
    return loadModule != nullptr && getFunction != nullptr && launch != nullptr;
  }

 private:
  static void* entryPoint(const char* symbol) {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    // The ABI these symbols had in CUDA 12.0, which declares them as above.
    const cudaError_t status = cudaGetDriverEntryPointByVersion(
        symbol, &function, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t status =
        cudaGetDriverEntryPoint(symbol, &function, cudaEnableDefault, &found);
#endif
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return function;
  }

  static DriverFunctions find() {
    DriverFunctions functions;
    functions.loadModule =
        reinterpret_cast<ModuleLoadData>(entryPoint("cuModuleLoadData"));
    functions.getFunction =
        reinterpret_cast<ModuleGetFunction>(entryPoint("cuModuleGetFunction"));
    functions.launch =
        reinterpret_cast<LaunchKernel>(entryPoint("cuLaunchKernel"));
    return functions;
  }
};

// Says once per process why the host waits for engine ops.
void noteHostWaits(const std::string& why) {
  static std::once_flag noted;
  std::call_once(noted, [&] {
    notice(
        LogLevel::kWarning,
        "fairring: waiting on a CUDA engine op holds the host until the op is "
        "done: " +
            why);
  });
}

// The wait kernel, loaded once per device into its primary context; null
// where it could not be (noted once).
CUfunction waitKernel(c10::Device device) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, CUfunction> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto found = loaded.find(device.index()); found != loaded.end()) {
    return found->second;
  }
  const auto& driver = DriverFunctions::get();
  CUfunction kernel = nullptr;
  if (!driver.found()) {
    noteHostWaits("the CUDA driver lacks a function it needs");
  } else {
    const c10::cuda::CUDAGuard onDevice(device); // its primary context
    CUmodule module = nullptr;
    CUresult result = driver.loadModule(&module, kWaitPtx);
    if (result == CUDA_SUCCESS) {
      result = driver.getFunction(&kernel, module, "fairring_wait_signal");
    }
    if (result != CUDA_SUCCESS) {
      kernel = nullptr;
      noteHostWaits(
          "loading its signal wait kernel failed with CUDA driver error " +
          std::to_string(static_cast<int>(result)));
    }
  }
  loaded.emplace(device.index(), kernel);
  return kernel;
}

void checked(CUresult result, const char* what) {
  TORCH_CHECK(
      result == CUDA_SUCCESS,
      "fairring: ",
      what,
      " failed with CUDA driver error ",
      static_cast<int>(result));
}

// Pinned, mapped pages of words, handed out one word at a time and never
// freed (CudaSignals).
class WordPages {
 public:
  static constexpr size_t kPageBytes = 4096;

  static std::pair<uint32_t*, uint64_t> take(c10::Device device) {
    static WordPages pages;
    // Legal while another thread captures a graph in global mode.
    const c10::cuda::CUDAStreamCaptureModeGuard relaxed(
        cudaStreamCaptureModeRelaxed);
    const c10::cuda::CUDAGuard onDevice(device);
    std::lock_guard<std::mutex> lock(pages.mutex_);
    if (pages.next_ == nullptr || pages.left_ == 0) {
      pages.addPage();
    }
    uint32_t* host = pages.next_++;
    --pages.left_;
    *host = 0;
    void* address = nullptr;
    // Portable and mapped: one device address, valid on every device (UVA).
    C10_CUDA_CHECK(cudaHostGetDevicePointer(&address, host, 0));
    return {host, reinterpret_cast<uint64_t>(address)};
  }

 private:
  void addPage() {
    void* page = nullptr;
    C10_CUDA_CHECK(cudaHostAlloc(
        &page, kPageBytes, cudaHostAllocMapped | cudaHostAllocPortable));
    next_ = static_cast<uint32_t*>(page);
    left_ = kPageBytes / sizeof(uint32_t);
  }

  std::mutex mutex_;
  uint32_t* next_ = nullptr;
  size_t left_ = 0;
};

} // namespace

std::unique_ptr<CudaSignals> CudaSignals::make(c10::Device device) {
  const CUfunction kernel = waitKernel(device);
  if (kernel == nullptr) {
    return nullptr;
  }
  std::array<Word, kSignals> words{};
  for (Word& word : words) {
    const auto [host, address] = WordPages::take(device);
    word = Word{host, address};
  }
  return std::make_unique<CudaSignals>(device, kernel, words);
}

void CudaSignals::wait(void* stream, Signal signal, uint32_t ticket) const {
  // The driver launches into the thread's current context: the device's
  // primary one, where the kernel was loaded, whatever device is current.
  const c10::cuda::CUDAGuard onDevice(device_);
  uint64_t word = words_[static_cast<int>(signal)].device;
  std::array<void*, 2> arguments{&word, &ticket};
  checked(
      DriverFunctions::get().launch(
          static_cast<CUfunction>(kernel_),
          1,
          1,
          1,
          1,
          1,
          1,
          0,
          static_cast<CUstream>(stream),
          arguments.data(),
          nullptr),
      "launching the signal wait kernel (an engine stream waiting for the "
      "rails)");
}

void CudaSignals::raise(Signal signal, uint32_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (opened_) {
    return;
  }
  uint32_t& raised = raised_[static_cast<int>(signal)];
  raised = laterTicket(raised, ticket);
  store(signal, raised);
}

void CudaSignals::open() {
  std::lock_guard<std::mutex> lock(mutex_);
  opened_ = true;
  for (int signal = 0; signal < kSignals; ++signal) {
    store(static_cast<Signal>(signal), raised_[signal] + (1u << 30));
  }
}

void CudaSignals::store(Signal signal, uint32_t value) {
  std::atomic_ref<uint32_t>(*words_[static_cast<int>(signal)].host)
      .store(value, std::memory_order_release);
}

} // namespace fairring
