#include "backend.h"

#include <algorithm>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "cuda_support.h"
#include "work.h"

namespace fairring {

namespace {

template <typename Visit>
void forEachTensor(const at::Tensor& tensor, Visit&& visit) {
  visit(tensor);
}

template <typename Visit>
void forEachTensor(const std::vector<at::Tensor>& tensors, Visit&& visit) {
  for (const auto& tensor : tensors) {
    visit(tensor);
  }
}

template <typename Visit>
void forEachTensor(
    const std::vector<std::vector<at::Tensor>>& tensorLists,
    Visit&& visit) {
  for (const auto& tensors : tensorLists) {
    forEachTensor(tensors, visit);
  }
}

// Gloo, which serves CPU tensors, has no PREMUL_SUM and cannot average
// integers; say so up front instead of failing inside Gloo. (all_reduce turns
// PREMUL_SUM into SUM first: see premultiplied().)
void checkCpuReduction(
    const char* opName,
    const c10d::ReduceOp& op,
    const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(
      op != c10d::ReduceOp::PREMUL_SUM,
      "fairring: ",
      opName,
      " with ReduceOp.PREMUL_SUM is not supported for CPU tensors (all_reduce "
      "supports it); scale the tensor and use ReduceOp.SUM");
  if (op != c10d::ReduceOp::AVG) {
    return;
  }
  for (const auto& tensor : tensors) {
    TORCH_CHECK(
        at::isFloatingType(tensor.scalar_type()),
        "fairring: ",
        opName,
        " with ReduceOp.AVG needs a floating-point tensor, got ",
        tensor.scalar_type(),
        "; use ReduceOp.SUM and divide by the group size");
  }
}

// PREMUL_SUM is the sum of factor x input over ranks: scaling this rank's
// input by its own factor first, in place (the all-reduce overwrites it
// anyway), turns it into a plain SUM that any path can run.
c10d::AllreduceOptions premultiplied(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts) {
  const auto* supplement =
      dynamic_cast<const c10d::PreMulSumSupplement*>(
          opts.reduceOp.supplement_.get());
  TORCH_CHECK(
      supplement != nullptr,
      "fairring: all_reduce with ReduceOp.PREMUL_SUM needs a factor; build it "
      "with torch.distributed._make_nccl_premul_sum(factor)");
  for (auto& tensor : tensors) {
    TORCH_CHECK(
        at::isFloatingType(tensor.scalar_type()),
        "fairring: all_reduce with ReduceOp.PREMUL_SUM needs a floating-point "
        "tensor, got ",
        tensor.scalar_type());
    if (supplement->tensor_factor.defined()) {
      tensor.mul_(supplement->tensor_factor.to(tensor.device()));
    } else {
      tensor.mul_(supplement->double_factor);
    }
  }
  c10d::AllreduceOptions sum = opts;
  sum.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  return sum;
}

// Whether the engine takes every tensor of a coalesced all-reduce, all of one
// dtype and device so that they travel as one packed tensor.
bool engineHandlesAll(
    const std::vector<at::Tensor>& tensors,
    c10d::ReduceOp::RedOpType op) {
  return !tensors.empty() &&
      std::all_of(tensors.begin(), tensors.end(), [&](const at::Tensor& t) {
           return t.scalar_type() == tensors[0].scalar_type() &&
               t.device() == tensors[0].device() && Engine::handles(t, op);
         });
}

// Copies consecutive pieces of the 1-D `packed`, each as long as the next
// tensor, into `tensors`.
void unpackInto(
    const at::Tensor& packed,
    const std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (const auto& tensor : tensors) {
    tensor.copy_(
        packed.narrow(0, offset, tensor.numel()).view(tensor.sizes()));
    offset += tensor.numel();
  }
}

// One engine all-reduce of the tensors packed end to end; the result is
// unpacked into them when it completes (on the engine's all-gather thread).
c10::intrusive_ptr<c10::ivalue::Future> packedAllreduce(
    Engine& engine,
    const std::vector<at::Tensor>& tensors,
    c10d::ReduceOp::RedOpType op) {
  std::vector<at::Tensor> flattened;
  flattened.reserve(tensors.size());
  for (const auto& tensor : tensors) {
    flattened.push_back(tensor.reshape({-1}));
  }
  at::Tensor packed = at::cat(flattened);
  return engine.allreduce(packed, op)->then(
      [tensors, packed](c10::ivalue::Future& done) {
        done.value(); // rethrows the engine's error into the returned future
        unpackInto(packed, tensors);
        return c10::IValue(tensors);
      },
      c10::ListType::create(c10::TensorType::get()));
}

} // namespace

Backend::Backend(
    c10::intrusive_ptr<c10d::Store> store,
    Topology topology,
    Config config,
    std::chrono::milliseconds timeout,
    c10::intrusive_ptr<c10d::Backend> cpuBackend,
    Engine::Groups cpuLocalGroups)
    : c10d::Backend(topology.rank(), topology.worldSize()),
      store_(std::move(store)),
      topology_(std::move(topology)),
      config_(config),
      timeout_(timeout),
      cpuBackend_(std::move(cpuBackend)) {
  TORCH_CHECK(store_, "fairring: a store is required");
  TORCH_CHECK(cpuBackend_, "fairring: a CPU backend is required");
  TORCH_CHECK(
      cpuBackend_->getRank() == getRank() &&
          cpuBackend_->getSize() == getSize(),
      "fairring: the CPU backend is rank ",
      cpuBackend_->getRank(),
      " of ",
      cpuBackend_->getSize(),
      " but the topology says rank ",
      getRank(),
      " of ",
      getSize());
  if (topology_.numMachines() > 1) {
    cpuLocalGroups.flat = cpuBackend_;
    cpuEngine_ =
        makeEngine(c10::Device(c10::kCPU), std::move(cpuLocalGroups));
  }
  init();
}

template <typename... Tensors>
c10d::Backend& Backend::route(const char* opName, const Tensors&... tensors) {
  std::optional<c10::Device> first;
  auto visit = [&](const at::Tensor& tensor) {
    const c10::Device device = tensor.device();
    if (!first) {
      first = device;
      return;
    }
    TORCH_CHECK(
        device.type() == first->type(),
        "fairring: ",
        opName,
        " got tensors on both ",
        *first,
        " and ",
        device,
        "; all tensors of one operation must be on the same device type");
  };
  (forEachTensor(tensors, visit), ...);
  if (!first || first->is_cpu()) {
    return *cpuBackend_;
  }
  TORCH_CHECK(
      first->is_cuda(),
      "fairring: ",
      opName,
      " got a tensor on ",
      *first,
      "; fairring supports CPU and CUDA tensors");
  return cudaBackend();
}

template <typename Call, typename... Tensors>
c10::intrusive_ptr<c10d::Work> Backend::forward(
    const char* opName,
    Call&& call,
    const Tensors&... tensors) {
  c10d::Backend& inner = route(opName, tensors...);
  bool collect = false;
  {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    if (coalescing_) {
      if (coalescing_->inner == nullptr) {
        coalescing_->inner = &inner;
        if (inner.supportsCoalescing()) {
          inner.startCoalescing();
        }
      }
      TORCH_CHECK(
          coalescing_->inner == &inner,
          "fairring: ",
          opName,
          " in a coalescing block that started on another device type; "
          "coalesce CPU and CUDA operations in separate blocks");
      collect = !inner.supportsCoalescing();
    }
  }
  auto work = call(inner);
  if (collect) {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    coalescing_->works.push_back(work);
  }
  return work;
}

c10d::Backend& Backend::cudaBackend() {
  std::lock_guard<std::mutex> lock(cudaMutex_);
  return cudaBackendLocked();
}

c10d::Backend& Backend::cudaBackendLocked() {
  if (!cudaBackend_) {
    cudaBackend_ = cuda::makeNcclBackend(
        store_, topology_.rank(), topology_.worldSize(), timeout_);
    if (auto device = getBoundDeviceId()) {
      cudaBackend_->setBoundDeviceId(device);
    }
  }
  return *cudaBackend_;
}

c10::intrusive_ptr<c10d::Backend> Backend::cudaBackendIfCreated() {
  std::lock_guard<std::mutex> lock(cudaMutex_);
  return cudaBackend_;
}

const Engine* Backend::cudaEngine() const {
  std::lock_guard<std::mutex> lock(cudaMutex_);
  return cudaEngine_.get();
}

Engine* Backend::engineFor(
    const c10d::Backend& inner,
    const at::Tensor& tensor) {
  if (isCpu(inner)) {
    return cpuEngine_.get();
  }
  if (!config_.cudaEngine || topology_.numMachines() == 1 ||
      !tensor.is_cuda()) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(cudaMutex_);
  if (!cudaEngine_) {
    cudaEngine_ = makeCudaEngine(tensor.device());
  }
  // One engine per group, on the device of its first all-reduce; c10d binds
  // a rank to one device, so tensors elsewhere are unusual: NCCL takes them.
  return cudaEngine_->device() == tensor.device() ? cudaEngine_.get()
                                                  : nullptr;
}

// Called with cudaMutex_ held.
std::unique_ptr<Engine> Backend::makeCudaEngine(c10::Device device) {
  Engine::Groups groups;
  cudaBackendLocked();
  groups.flat = cudaBackend_;
  if (topology_.localSize() > 1) {
    // One NCCL group per local step, for the reason the CPU engine has one
    // Gloo group per step (see fairring/_registration.py).
    auto localGroup = [&](const std::string& step) {
      return cuda::makeNcclBackend(
          c10::make_intrusive<c10d::PrefixStore>(
              "fairring/machine" + std::to_string(topology_.machine()) + "/" +
                  step + "/cuda/",
              store_),
          topology_.localRank(),
          topology_.localSize(),
          timeout_);
    };
    groups.reduceScatter = localGroup("reduce-scatter");
    groups.allGather = localGroup("all-gather");
  }
  return makeEngine(device, std::move(groups));
}

std::unique_ptr<Engine> Backend::makeEngine(
    c10::Device device,
    Engine::Groups groups) {
  return std::make_unique<Engine>(
      topology_,
      config_,
      device,
      std::move(groups),
      std::make_unique<Rails>(
          store_,
          "fairring/rails/" + c10::DeviceTypeName(device.type(), true) + "/",
          topology_,
          resolveListenAddress(config_.socketInterface),
          device,
          !config_.infinibandDisabled,
          timeout_));
}

c10::intrusive_ptr<c10d::Work> Backend::broadcast(
    std::vector<at::Tensor>& tensors,
    const c10d::BroadcastOptions& opts) {
  return forward(
      "broadcast",
      [&](c10d::Backend& inner) { return inner.broadcast(tensors, opts); },
      tensors);
}

c10::intrusive_ptr<c10d::Work> Backend::allreduce(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts) {
  return forward(
      "allreduce",
      [&](c10d::Backend& inner) {
        Engine* engine =
            tensors.size() == 1 ? engineFor(inner, tensors[0]) : nullptr;
        if (!isCpu(inner) && engine == nullptr) {
          return inner.allreduce(tensors, opts); // NCCL: every op natively
        }
        const c10d::AllreduceOptions ownOpts =
            opts.reduceOp == c10d::ReduceOp::PREMUL_SUM
            ? premultiplied(tensors, opts)
            : opts;
        if (isCpu(inner)) {
          checkCpuReduction("allreduce", ownOpts.reduceOp, tensors);
        }
        if (engine && Engine::handles(tensors[0], ownOpts.reduceOp)) {
          return c10::intrusive_ptr<c10d::Work>(c10::make_intrusive<FutureWork>(
              engine->allreduce(tensors[0], ownOpts.reduceOp),
              c10d::OpType::ALLREDUCE,
              "all_reduce"));
        }
        return inner.allreduce(tensors, ownOpts);
      },
      tensors);
}

c10::intrusive_ptr<c10d::Work> Backend::allreduce_sparse(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts) {
  return forward(
      "allreduce_sparse",
      [&](c10d::Backend& inner) {
        return inner.allreduce_sparse(tensors, opts);
      },
      tensors);
}

c10::intrusive_ptr<c10d::Work> Backend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  return forward(
      "allreduce_coalesced",
      [&](c10d::Backend& inner) {
        Engine* engine =
            tensors.empty() ? nullptr : engineFor(inner, tensors[0]);
        if (isCpu(inner)) {
          checkCpuReduction("allreduce_coalesced", opts.reduceOp, tensors);
        }
        if (engine && engineHandlesAll(tensors, opts.reduceOp)) {
          return c10::intrusive_ptr<c10d::Work>(c10::make_intrusive<FutureWork>(
              packedAllreduce(*engine, tensors, opts.reduceOp),
              c10d::OpType::ALLREDUCE_COALESCED,
              "all_reduce_coalesced"));
        }
        return inner.allreduce_coalesced(tensors, opts);
      },
      tensors);
}

c10::intrusive_ptr<c10d::Work> Backend::reduce(
    std::vector<at::Tensor>& tensors,
    const c10d::ReduceOptions& opts) {
  return forward(
      "reduce",
      [&](c10d::Backend& inner) {
        if (isCpu(inner)) {
          checkCpuReduction("reduce", opts.reduceOp, tensors);
        }
        return inner.reduce(tensors, opts);
      },
      tensors);
}

c10::intrusive_ptr<c10d::Work> Backend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return forward(
      "allgather",
      [&](c10d::Backend& inner) {
        return inner.allgather(outputs, inputs, opts);
      },
      outputs,
      inputs);
}

c10::intrusive_ptr<c10d::Work> Backend::all_gather_single(
    at::Tensor& output,
    at::Tensor& input,
    const c10d::AllgatherOptions& opts) {
  return forward(
      "all_gather_single",
      [&](c10d::Backend& inner) {
        return inner.all_gather_single(output, input, opts);
      },
      output,
      input);
}

c10::intrusive_ptr<c10d::Work> Backend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return forward(
      "allgather_coalesced",
      [&](c10d::Backend& inner) {
        return inner.allgather_coalesced(outputLists, inputs, opts);
      },
      outputLists,
      inputs);
}

c10::intrusive_ptr<c10d::Work> Backend::all_gather_single_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return forward(
      "all_gather_single_coalesced",
      [&](c10d::Backend& inner) {
        return inner.all_gather_single_coalesced(outputs, inputs, opts);
      },
      outputs,
      inputs);
}

c10::intrusive_ptr<c10d::Work> Backend::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return forward(
      "gather",
      [&](c10d::Backend& inner) { return inner.gather(outputs, inputs, opts); },
      outputs,
      inputs);
}

c10::intrusive_ptr<c10d::Work> Backend::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return forward(
      "scatter",
      [&](c10d::Backend& inner) {
        return inner.scatter(outputs, inputs, opts);
      },
      outputs,
      inputs);
}

c10::intrusive_ptr<c10d::Work> Backend::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return forward(
      "reduce_scatter",
      [&](c10d::Backend& inner) {
        if (isCpu(inner)) {
          checkCpuReduction("reduce_scatter", opts.reduceOp, outputs);
        }
        return inner.reduce_scatter(outputs, inputs, opts);
      },
      outputs,
      inputs);
}

c10::intrusive_ptr<c10d::Work> Backend::reduce_scatter_single(
    at::Tensor& output,
    at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
  return forward(
      "reduce_scatter_single",
      [&](c10d::Backend& inner) {
        if (isCpu(inner)) {
          checkCpuReduction("reduce_scatter_single", opts.reduceOp, {output});
        }
        return inner.reduce_scatter_single(output, input, opts);
      },
      output,
      input);
}

c10::intrusive_ptr<c10d::Work> Backend::reduce_scatter_single_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return forward(
      "reduce_scatter_single_coalesced",
      [&](c10d::Backend& inner) {
        if (isCpu(inner)) {
          checkCpuReduction(
              "reduce_scatter_single_coalesced", opts.reduceOp, outputs);
        }
        return inner.reduce_scatter_single_coalesced(outputs, inputs, opts);
      },
      outputs,
      inputs);
}

c10::intrusive_ptr<c10d::Work> Backend::all_to_all_single(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes,
    const c10d::AllToAllOptions& opts) {
  return forward(
      "all_to_all_single",
      [&](c10d::Backend& inner) {
        return inner.all_to_all_single(
            output, input, outputSplitSizes, inputSplitSizes, opts);
      },
      output,
      input);
}

c10::intrusive_ptr<c10d::Work> Backend::alltoall(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  return forward(
      "alltoall",
      [&](c10d::Backend& inner) {
        return isCpu(inner) ? alltoallAsSingle(inner, outputs, inputs, opts)
                            : inner.alltoall(outputs, inputs, opts);
      },
      outputs,
      inputs);
}

// Gloo's list alltoall needs every tensor to have one shape; NCCL's does not.
// Sending the flattened lists with element splits serves any shapes.
c10::intrusive_ptr<c10d::Work> Backend::alltoallAsSingle(
    c10d::Backend& inner,
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(
      static_cast<int>(outputs.size()) == getSize() &&
          static_cast<int>(inputs.size()) == getSize(),
      "fairring: alltoall needs one input and one output tensor per rank (",
      getSize(),
      "), got ",
      inputs.size(),
      " inputs and ",
      outputs.size(),
      " outputs");
  std::vector<at::Tensor> flatInputs;
  std::vector<int64_t> inputSplits;
  std::vector<int64_t> outputSplits;
  int64_t outputElements = 0;
  for (int peer = 0; peer < getSize(); ++peer) {
    TORCH_CHECK(
        inputs[peer].scalar_type() == inputs[0].scalar_type() &&
            outputs[peer].scalar_type() == inputs[0].scalar_type(),
        "fairring: alltoall tensors must share one dtype");
    flatInputs.push_back(inputs[peer].reshape({-1}));
    inputSplits.push_back(inputs[peer].numel());
    outputSplits.push_back(outputs[peer].numel());
    outputElements += outputs[peer].numel();
  }
  at::Tensor packedInput = at::cat(flatInputs);
  at::Tensor packedOutput = at::empty({outputElements}, packedInput.options());
  auto work = inner.all_to_all_single(
      packedOutput, packedInput, outputSplits, inputSplits, opts);
  // Runs on Gloo's worker thread once the exchange is done: unpack.
  auto unpacked = work->getFuture()->then(
      [outputs, packedOutput, packedInput](c10::ivalue::Future& done) {
        done.value(); // rethrows the exchange's error, if any
        unpackInto(packedOutput, outputs);
        return c10::IValue(outputs);
      },
      c10::ListType::create(c10::TensorType::get()));
  return c10::make_intrusive<FutureWork>(
      unpacked, c10d::OpType::ALLTOALL, "all_to_all");
}

c10::intrusive_ptr<c10d::Work> Backend::send(
    std::vector<at::Tensor>& tensors,
    int dstRank,
    int tag) {
  return forward(
      "send",
      [&](c10d::Backend& inner) { return inner.send(tensors, dstRank, tag); },
      tensors);
}

c10::intrusive_ptr<c10d::Work> Backend::recv(
    std::vector<at::Tensor>& tensors,
    int srcRank,
    int tag) {
  return forward(
      "recv",
      [&](c10d::Backend& inner) { return inner.recv(tensors, srcRank, tag); },
      tensors);
}

c10::intrusive_ptr<c10d::Work> Backend::recvAnysource(
    std::vector<at::Tensor>& tensors,
    int tag) {
  return forward(
      "recvAnysource",
      [&](c10d::Backend& inner) { return inner.recvAnysource(tensors, tag); },
      tensors);
}

c10::intrusive_ptr<c10d::Work> Backend::barrier(
    const c10d::BarrierOptions& opts) {
  return cpuBackend_->barrier(opts);
}

void Backend::monitoredBarrier(
    const c10d::BarrierOptions& opts,
    bool waitAllRanks) {
  cpuBackend_->monitoredBarrier(opts, waitAllRanks);
}

void Backend::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalescingMutex_);
  TORCH_CHECK(
      !coalescing_,
      "fairring: startCoalescing called while a coalescing block is open");
  coalescing_.emplace();
}

c10::intrusive_ptr<c10d::Work> Backend::endCoalescing() {
  CoalescingBlock block;
  {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    TORCH_CHECK(
        coalescing_,
        "fairring: endCoalescing called without a matching startCoalescing");
    block = std::move(*coalescing_);
    coalescing_.reset();
  }
  if (block.inner != nullptr && block.inner->supportsCoalescing()) {
    return block.inner->endCoalescing();
  }
  return c10::make_intrusive<AllOfWork>(std::move(block.works));
}

void Backend::setBoundDeviceId(std::optional<at::Device> device) {
  c10d::Backend::setBoundDeviceId(device);
  if (auto cuda = cudaBackendIfCreated()) {
    cuda->setBoundDeviceId(device);
  }
}

void Backend::abortCudaEngine(const std::string& reason) {
  std::lock_guard<std::mutex> lock(cudaMutex_);
  if (cudaEngine_) {
    cudaEngine_->abort(reason);
  }
}

void Backend::abort() {
  if (cpuEngine_) {
    cpuEngine_->abort("the process group was aborted");
  }
  abortCudaEngine("the process group was aborted");
  if (auto cuda = cudaBackendIfCreated()) {
    cuda->abort();
  }
  cpuBackend_->abort();
}

void Backend::shutdown() {
  if (cpuEngine_) {
    cpuEngine_->abort("the process group was shut down");
  }
  abortCudaEngine("the process group was shut down");
  if (auto cuda = cudaBackendIfCreated()) {
    cuda->shutdown();
  }
  cpuBackend_->shutdown();
}

} // namespace fairring
