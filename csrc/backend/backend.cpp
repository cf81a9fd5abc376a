#include "backend/backend.h"

#include <algorithm>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "backend/allreduce_args.h"
#include "backend/engine_factory.h"
#include "backend/pending_report.h"
#include "backend/work.h"

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
    const std::vector<std::vector<at::Tensor>>& tensorLists, Visit&& visit) {
  for (const auto& tensors : tensorLists) {
    forEachTensor(tensors, visit);
  }
}

// Every tensor an operation reads or writes, for MemoryOrder.
template <typename... Tensors>
std::vector<at::Tensor> tensorsOf(const Tensors&... tensors) {
  std::vector<at::Tensor> all;
  (forEachTensor(tensors, [&](const at::Tensor& t) { all.push_back(t); }), ...);
  return all;
}

constexpr const char* kSameCollectives =
    "; every rank must issue the same collectives in the same order, "
    "all-reduces with the same sizes, dtypes and reduce ops";

} // namespace

Backend::Backend(
    c10::intrusive_ptr<c10d::Store> store,
    Topology topology,
    Config config,
    std::chrono::milliseconds timeout,
    c10::intrusive_ptr<c10d::Backend> cpuBackend,
    std::shared_ptr<InnerGroupFactory> innerGroups)
    : c10d::Backend(topology.rank(), topology.worldSize()),
      store_(std::move(store)),
      topology_(std::move(topology)),
      config_(config),
      timeout_(timeout),
      cpuBackend_(std::move(cpuBackend)),
      innerGroups_(std::move(innerGroups)),
      delegated_("fairring: rank " + std::to_string(topology_.rank()) + ": ") {
  TORCH_CHECK(store_, "fairring: a store is required");
  TORCH_CHECK(cpuBackend_, "fairring: a CPU backend is required");
  TORCH_CHECK(innerGroups_, "fairring: an inner group factory is required");
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
  init();
  listForPendingReport(this);
}

Backend::~Backend() {
  unlistForPendingReport(this); // waits out a report reading this backend
  // Engines first: their stage threads use the inner groups. Destroyed
  // without the lock: a completion callback they run may call back in here.
  std::array<std::unique_ptr<Engine>, 2> engines;
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    engines.swap(engines_);
  }
  for (auto& engine : engines) {
    engine.reset();
  }
}

template <typename... Tensors>
c10::DeviceType Backend::route(const char* opName, const Tensors&... tensors) {
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
    return c10::kCPU;
  }
  TORCH_CHECK(
      first->is_cuda(),
      "fairring: ",
      opName,
      " got a tensor on ",
      *first,
      "; fairring supports CPU and CUDA tensors");
  return c10::kCUDA;
}

c10d::Backend& Backend::delegate(c10::DeviceType type) {
  return type == c10::kCPU ? *cpuBackend_ : cudaBackend();
}

template <typename Call, typename... Tensors>
c10::intrusive_ptr<c10d::Work> Backend::forward(
    const char* opName, Call&& call, const Tensors&... tensors) {
  const c10::DeviceType type = route(opName, tensors...);
  const uint64_t seq = nextCollective(
      std::string(opName) + " " +
      c10::DeviceTypeName(type, /*lower_case=*/true));
  return forwardTo(
      opName, type, seq, tensorsOf(tensors...), std::forward<Call>(call));
}

template <typename Call>
c10::intrusive_ptr<c10d::Work> Backend::forwardTo(
    const char* opName,
    c10::DeviceType type,
    std::optional<uint64_t> collective,
    const std::vector<at::Tensor>& touches,
    Call&& call) {
  if (collective) {
    checkNotFailed(opName);
  }
  c10d::Backend& inner = delegate(type);
  bool collect = false;
  bool native = false;
  {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    if (CoalescingBlock* block = openBlockLocked(opName, type)) {
      collect = !inner.supportsCoalescing();
      if (!collect && block->nativeBlock == nullptr) {
        block->nativeBlock = &inner;
        inner.startCoalescing();
      }
      native = !collect;
    }
  }
  const auto executor = isCpu(inner) ? MemoryOrder::Executor::kGloo
                                     : MemoryOrder::Executor::kNccl;
  if (collective) {
    memoryOrder_.awaitOverlapping(touches, executor, timeout());
  }
  if (!native) {
    followEngineLaunches(type); // a native block launches at its end
  }
  auto work = call(inner);
  if (collective && isCpu(inner)) {
    work = delegated_.watch(work, work->retrieveOpType(), *collective, {});
  }
  work = hooks_.report(std::move(work));
  // A native block (NCCL's group) launches nothing before it ends, so its
  // members' Works are not waited for; the block orders them itself.
  if (collective && !native) {
    memoryOrder_.track(touches, executor, work);
  }
  if (collect) {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    coalescing_->works.push_back(work);
  }
  return work;
}

Backend::CoalescingBlock* Backend::openBlockLocked(
    const char* opName, c10::DeviceType type) {
  if (!coalescing_) {
    return nullptr;
  }
  if (!coalescing_->type) {
    coalescing_->type = type;
  }
  TORCH_CHECK(
      *coalescing_->type == type,
      "fairring: ",
      opName,
      " on ",
      c10::DeviceTypeName(type),
      " tensors inside a coalescing block of ",
      c10::DeviceTypeName(*coalescing_->type),
      " operations; coalesce CPU and CUDA operations in separate blocks");
  return &*coalescing_;
}

void Backend::joinBlock(
    const char* opName,
    c10::DeviceType type,
    const c10::intrusive_ptr<c10d::Work>& work) {
  std::lock_guard<std::mutex> lock(coalescingMutex_);
  if (CoalescingBlock* block = openBlockLocked(opName, type)) {
    block->works.push_back(work);
  }
}

c10d::Backend& Backend::cudaBackend() {
  if (auto created = cudaBackendIfCreated()) {
    return *created;
  }
  std::lock_guard<std::mutex> creating(creationMutex_);
  if (auto created = cudaBackendIfCreated()) {
    return *created;
  }
  auto made = innerGroups_->delegate(c10::kCUDA);
  TORCH_CHECK(made, "fairring: no CUDA delegate group could be made");
  if (auto device = getBoundDeviceId()) {
    made->setBoundDeviceId(device);
  }
  made->setTimeout(timeout()); // setTimeout may have changed it since
  std::lock_guard<std::mutex> lock(stateMutex_);
  cudaBackend_ = std::move(made);
  return *cudaBackend_;
}

c10::intrusive_ptr<c10d::Backend> Backend::cudaBackendIfCreated() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return cudaBackend_;
}

const Engine* Backend::engine(c10::DeviceType type) const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return engines_[slotOf(type)].get();
}

AllreduceRoute Backend::choosePath(const AllreduceArgs& args) const {
  return chooseAllreducePath(args, topology_.servesEngine(), config_);
}

Engine* Backend::engineFor(c10::Device device) {
  TORCH_CHECK(
      !cudaGraphCaptureUnderway(device),
      "fairring: an all-reduce of a CUDA tensor on the Herring engine "
      "(FAIRRING_CUDA_ENGINE=1) was issued during CUDA graph capture; the "
      "engine waits on the host, which a graph cannot hold. Issue it outside "
      "the captured region, or leave FAIRRING_CUDA_ENGINE unset so that NCCL "
      "runs it");
  return engineOn(device);
}

Engine* Backend::engineOn(c10::Device device) {
  const size_t slot = slotOf(device.type());
  const auto made = [&] {
    std::lock_guard<std::mutex> lock(stateMutex_);
    return engines_[slot].get();
  };
  Engine* engine = made();
  if (engine == nullptr) {
    std::lock_guard<std::mutex> creating(creationMutex_);
    engine = made();
    if (engine == nullptr) {
      {
        // Connecting the engine's NCCL groups inside an open NCCL group call
        // (a native coalescing block) would wait for that block to end.
        std::lock_guard<std::mutex> lock(coalescingMutex_);
        TORCH_CHECK(
            !coalescing_ || coalescing_->nativeBlock == nullptr,
            "fairring: the group's first ",
            device.type(),
            " all-reduce was issued inside a coalescing block after a NCCL "
            "operation; the engine it creates cannot connect there. Issue "
            "one all-reduce before the block, or make the all-reduce the "
            "block's first operation.");
      }
      auto created = makeEngine(device); // collective; calls into Python
      const std::string rails = created->describeRails();
      {
        std::lock_guard<std::mutex> lock(stateMutex_);
        engines_[slot] = std::move(created);
        engine = engines_[slot].get();
      }
      innerGroups_->engineMade(device, rails);
    }
  }
  // One engine per device type, on the device of its first all-reduce; c10d
  // binds a rank to one device, so tensors elsewhere are unusual: the
  // delegate takes them.
  return engine->device() == device ? engine : nullptr;
}

bool Backend::coalescingBlockOpen() {
  std::lock_guard<std::mutex> lock(coalescingMutex_);
  return coalescing_.has_value();
}

void Backend::followEngineLaunches(c10::DeviceType type) {
  if (type != c10::kCUDA) {
    return;
  }
  Engine* engine = nullptr;
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    engine = engines_[slotOf(c10::kCUDA)].get();
  }
  if (engine != nullptr) { // engines live until the destructor
    engine->awaitLaunchesOfIssuedOps();
  }
}

std::unique_ptr<Engine> Backend::makeEngine(c10::Device device) {
  // The hooks run on the engine's threads, which the engine joins before it
  // goes; the backend outlives its engines.
  Engine::Hooks hooks{
      [this] { return ledger_.report(); },
      [this](int neighbour, std::string_view status) {
        onPeerStatus(neighbour, status);
      },
      [this](const std::string& cause) {
        hooks_.runAbortHooks();
        delegated_.fail(cause);
      }};
  return fairring::makeEngine(
      device,
      EngineSite{
          topology_, config_, *innerGroups_, store_, getGroupUid(), timeout()},
      std::move(hooks));
}

uint64_t Backend::nextCollective(std::string signature) {
  std::optional<CollectiveLedger::Disagreement> found;
  const uint64_t seq = ledger_.record(std::move(signature), found);
  if (found) {
    // A neighbour that had issued it already reported it.
    failGroup(
        "the ranks issued different collectives: #" + std::to_string(seq) +
        " is '" + found->mine + "' on " + topology_.describeRank(getRank()) +
        " but '" + found->theirs + "' on " +
        topology_.describeRank(found->neighbour) + kSameCollectives);
  }
  return seq;
}

void Backend::onPeerStatus(int neighbour, std::string_view status) {
  const auto found = ledger_.compare(neighbour, status);
  if (!found) {
    return;
  }
  const std::string me = topology_.describeRank(getRank());
  const std::string them = topology_.describeRank(neighbour);
  if (found->seq == 0) {
    failGroup(them + " sent " + me + " " + found->theirs);
  } else if (found->mine != found->theirs) {
    failGroup(
        "the ranks issued different collectives: #" +
        std::to_string(found->seq) + " is '" + found->mine + "' on " + me +
        " but '" + found->theirs + "' on " + them + kSameCollectives);
  } else {
    failGroup(
        "the ranks issued different collectives before #" +
        std::to_string(found->seq) + " ('" + found->mine + "' on " + me +
        " and on " + them + ")" + kSameCollectives);
  }
}

template <typename Call>
void Backend::forEachEngine(Call&& call) {
  // Failing ops runs their callbacks here, which may call back into this
  // backend: call outside the lock (engines live until the destructor).
  std::array<Engine*, 2> engines{};
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    for (size_t slot = 0; slot < engines.size(); ++slot) {
      engines[slot] = engines_[slot].get();
    }
  }
  for (Engine* engine : engines) {
    if (engine != nullptr) {
      call(*engine);
    }
  }
}

void Backend::failGroup(const std::string& what) {
  forEachEngine([&](Engine& engine) { engine.fail(what); });
}

void Backend::checkNotFailed(const char* opName) const {
  const std::string failure = delegated_.failure();
  TORCH_CHECK(
      failure.empty(),
      "fairring: rank ",
      getRank(),
      ": ",
      opName,
      " not started: an earlier failure stopped the process group: ",
      failure);
}

c10::intrusive_ptr<c10d::Work> Backend::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  return forward(
      "broadcast",
      [&](c10d::Backend& inner) { return inner.broadcast(tensors, opts); },
      tensors);
}

c10::intrusive_ptr<c10d::Work> Backend::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  const c10::DeviceType type = route("allreduce", tensors);
  checkNoOverlap(tensors);
  const uint64_t seq = nextCollective(
      reductionSignature("all_reduce", type, tensors, opts.reduceOp));
  const AllreduceRoute path = choosePath(allreduceArgs(
      tensors, opts.reduceOp, /*coalesced=*/false, coalescingBlockOpen()));
  Engine* engine = path.path == AllreducePath::kEngine
      ? engineFor(tensors[0].device())
      : nullptr;
  // Before premultiplied() writes the tensors.
  memoryOrder_.awaitOverlapping(
      tensors,
      engine != nullptr       ? MemoryOrder::Executor::kEngine
          : type == c10::kCPU ? MemoryOrder::Executor::kGloo
                              : MemoryOrder::Executor::kNccl,
      timeout());
  std::vector<at::Tensor> aliases = withoutAutograd(tensors);
  const c10d::AllreduceOptions ownOpts =
      path.premultiplyHere ? premultiplied(aliases, opts) : opts;
  if (engine != nullptr) {
    return engineWork(
        "allreduce",
        "fairring:all_reduce",
        c10d::OpType::ALLREDUCE,
        engine->allreduce(
            aliases[0], ownOpts.reduceOp, timeoutOf(opts.timeout), seq),
        seq,
        tensors);
  }
  if (path.path == AllreducePath::kDelegateBelowThreshold) {
    ++flatAllreduces_[type == c10::kCPU ? 0 : 1];
  }
  return forwardTo("allreduce", type, seq, tensors, [&](c10d::Backend& inner) {
    if (isCpu(inner)) {
      checkCpuReduction("allreduce", ownOpts.reduceOp, tensors);
      return allreduceDense(inner, aliases, ownOpts, seq);
    }
    return inner.allreduce(tensors, ownOpts);
  });
}

c10::intrusive_ptr<c10d::Work> Backend::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
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
  const c10::DeviceType type = route("allreduce_coalesced", tensors);
  const uint64_t seq = nextCollective(
      reductionSignature("all_reduce_coalesced", type, tensors, opts.reduceOp));
  const AllreduceRoute path = choosePath(allreduceArgs(
      tensors, opts.reduceOp, /*coalesced=*/true, /*nativeBlockOpen=*/false));
  Engine* engine = path.path == AllreducePath::kEngine
      ? engineFor(tensors[0].device())
      : nullptr;
  if (engine != nullptr) {
    memoryOrder_.awaitOverlapping(
        tensors, MemoryOrder::Executor::kEngine, timeout());
    return engineWork(
        "allreduce_coalesced",
        "fairring:all_reduce_coalesced",
        c10d::OpType::ALLREDUCE_COALESCED,
        packedAllreduce(
            *engine,
            withoutAutograd(tensors),
            opts.reduceOp,
            timeoutOf(opts.timeout),
            seq),
        seq,
        tensors);
  }
  return forwardTo(
      "allreduce_coalesced", type, seq, tensors, [&](c10d::Backend& inner) {
        if (isCpu(inner)) {
          checkCpuReduction("allreduce_coalesced", opts.reduceOp, tensors);
        }
        return inner.allreduce_coalesced(tensors, opts);
      });
}

c10::intrusive_ptr<c10d::Work> Backend::engineWork(
    const char* opName,
    const char* profilingName,
    c10d::OpType opType,
    c10::intrusive_ptr<c10::ivalue::Future> future,
    uint64_t seq,
    const std::vector<at::Tensor>& tensors) {
  auto work = c10::intrusive_ptr<c10d::Work>(c10::make_intrusive<FutureWork>(
      std::move(future), opType, profilingName, seq, tensors));
  work = hooks_.report(std::move(work));
  joinBlock(opName, tensors[0].device().type(), work);
  memoryOrder_.track(tensors, MemoryOrder::Executor::kEngine, work);
  return work;
}

c10::intrusive_ptr<c10d::Work> Backend::reduce(
    std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> Backend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return forward(
      "all_gather_single",
      [&](c10d::Backend& inner) {
        return inner._allgather_base(output, input, opts);
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

c10::intrusive_ptr<c10d::Work> Backend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return forward(
      "all_gather_single_coalesced",
      [&](c10d::Backend& inner) {
        return inner.allgather_into_tensor_coalesced(outputs, inputs, opts);
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

c10::intrusive_ptr<c10d::Work> Backend::_reduce_scatter_base(
    at::Tensor& output,
    at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
  return forward(
      "reduce_scatter_single",
      [&](c10d::Backend& inner) {
        if (isCpu(inner)) {
          checkCpuReduction("reduce_scatter_single", opts.reduceOp, {output});
        }
        return inner._reduce_scatter_base(output, input, opts);
      },
      output,
      input);
}

c10::intrusive_ptr<c10d::Work> Backend::reduce_scatter_tensor_coalesced(
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
        return inner.reduce_scatter_tensor_coalesced(outputs, inputs, opts);
      },
      outputs,
      inputs);
}

c10::intrusive_ptr<c10d::Work> Backend::alltoall_base(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes,
    const c10d::AllToAllOptions& opts) {
  return forward(
      "all_to_all_single",
      [&](c10d::Backend& inner) {
        return inner.alltoall_base(
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
    flatInputs.push_back(inputs[peer].detach().reshape({-1}));
    inputSplits.push_back(inputs[peer].numel());
    outputSplits.push_back(outputs[peer].numel());
    outputElements += outputs[peer].numel();
  }
  at::Tensor packedInput = at::cat(flatInputs);
  at::Tensor packedOutput = at::empty({outputElements}, packedInput.options());
  auto work = inner.alltoall_base(
      packedOutput, packedInput, outputSplits, inputSplits, opts);
  // Runs on Gloo's worker thread once the exchange is done: unpack.
  auto unpacked = work->getFuture()->then(
      [outputs = withoutAutograd(outputs), packedOutput, packedInput](
          c10::ivalue::Future& done) {
        done.value(); // rethrows the exchange's error, if any
        unpackInto(packedOutput, outputs);
        return c10::IValue(outputs);
      },
      c10::ListType::create(c10::TensorType::get()));
  return c10::make_intrusive<FutureWork>(
      unpacked,
      c10d::OpType::ALLTOALL,
      "fairring:all_to_all",
      getSequenceNumberForGroup(),
      inputs);
}

c10::intrusive_ptr<c10d::Work> Backend::send(
    std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return forwardTo(
      "send",
      route("send", tensors),
      std::nullopt, // not a collective
      {},
      [&](c10d::Backend& inner) { return inner.send(tensors, dstRank, tag); });
}

c10::intrusive_ptr<c10d::Work> Backend::recv(
    std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return forwardTo(
      "recv",
      route("recv", tensors),
      std::nullopt, // not a collective
      {},
      [&](c10d::Backend& inner) { return inner.recv(tensors, srcRank, tag); });
}

c10::intrusive_ptr<c10d::Work> Backend::recvAnysource(
    std::vector<at::Tensor>& tensors, int tag) {
  return forwardTo(
      "recvAnysource",
      route("recvAnysource", tensors),
      std::nullopt, // not a collective
      {},
      [&](c10d::Backend& inner) { return inner.recvAnysource(tensors, tag); });
}

c10::intrusive_ptr<c10d::Work> Backend::barrier(
    const c10d::BarrierOptions& opts) {
  const uint64_t seq = nextCollective("barrier");
  checkNotFailed("barrier");
  return hooks_.report(delegated_.watch(
      cpuBackend_->barrier(opts), c10d::OpType::BARRIER, seq, {}));
}

void Backend::monitoredBarrier(
    const c10d::BarrierOptions& opts, bool waitAllRanks) {
  nextCollective("monitored_barrier");
  checkNotFailed("monitored_barrier");
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
  if (block.nativeBlock != nullptr) {
    followEngineLaunches(block.type.value_or(c10::kCPU));
    // NCCL returns no Work for a block that issued nothing.
    if (auto native = block.nativeBlock->endCoalescing()) {
      block.works.push_back(std::move(native));
    }
  }
  // Each operation's own Work was reported when it was issued; NCCL's
  // block Work was not.
  if (block.works.size() == 1 && block.nativeBlock == nullptr) {
    return block.works.front();
  }
  if (block.works.size() == 1) {
    return hooks_.report(block.works.front());
  }
  return hooks_.report(
      c10::make_intrusive<AllOfWork>(
          std::move(block.works), getSequenceNumberForGroup()));
}

#if FAIRRING_HAS_BACKEND_HOOKS
void Backend::registerCompletionHook(int64_t id, c10d::CompletionHook hook) {
  hooks_.addCompletionHook(
      id,
      [hook = std::move(hook)](uint64_t key, std::optional<float> durationMs) {
        c10d::CompletionHookArgs args;
        args.completionKey = key;
        args.duration_ms = durationMs;
        hook(args);
      });
}

void Backend::unregisterCompletionHook(int64_t id) {
  hooks_.removeCompletionHook(id);
}

void Backend::registerAbortHook(int64_t id, c10d::AbortHook hook) {
  hooks_.addAbortHook(id, std::move(hook));
}

void Backend::unregisterAbortHook(int64_t id) {
  hooks_.removeAbortHook(id);
}
#endif

void Backend::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  cpuBackend_->setTimeout(timeout);
  if (auto cuda = cudaBackendIfCreated()) {
    cuda->setTimeout(timeout);
  }
  forEachEngine([timeout](Engine& engine) { engine.setTimeout(timeout); });
}

std::vector<std::string> Backend::pending() const {
  // Engines live until the destructor, which first unlists this backend,
  // waiting for the report that called this: no lock is held while an
  // engine reports (its failure callbacks may take stateMutex_).
  std::array<const Engine*, 2> engines{};
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    for (size_t slot = 0; slot < engines.size(); ++slot) {
      engines[slot] = engines_[slot].get();
    }
  }
  std::vector<std::string> lines;
  for (const Engine* engine : engines) {
    if (engine == nullptr) {
      continue;
    }
    for (auto& line : engine->pending()) {
      lines.push_back("group " + getGroupUid() + ": " + std::move(line));
    }
  }
  return lines;
}

void Backend::eagerConnectSingleDevice(at::Device device) {
  if (!device.is_cuda()) {
    return; // the CPU delegate, Gloo, is connected when the group is made
  }
  if (!getBoundDeviceId()) {
    setBoundDeviceId(device); // cudaBackend() binds the delegate to it
  }
  cudaBackend().eagerConnectSingleDevice(device);
}

c10::intrusive_ptr<c10d::Backend::Options> Backend::getBackendOptions() {
  // A fresh copy each time: split_group edits what it is given.
  return c10::make_intrusive<Options>(getBackendName(), timeout());
}

c10::intrusive_ptr<c10d::Backend> Backend::split(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  if (std::find(ranks.begin(), ranks.end(), getRank()) == ranks.end()) {
    return nullptr; // not a member; the members need nothing from this rank
  }
  const std::string name = opts ? opts->group_name : std::string();
  const auto timeout = opts ? opts->timeout : this->timeout();
  std::lock_guard<std::mutex> creating(creationMutex_);
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    if (auto it = splits_.find(name); it != splits_.end()) {
      if (auto made = it->second.lock()) {
        return made;
      }
    }
  }
  auto made = innerGroups_->split(store, ranks, timeout, name);
  TORCH_CHECK(made, "fairring: split_group made no backend");
  std::lock_guard<std::mutex> lock(stateMutex_);
  std::erase_if(
      splits_, [](const auto& entry) { return entry.second.expired(); });
  splits_.insert_or_assign(name, c10::weak_intrusive_ptr<c10d::Backend>(made));
  return made;
}

void Backend::stopEngines(const std::string& did) {
  forEachEngine([&](Engine& engine) { engine.abort(did); });
}

void Backend::abort() {
  hooks_.quiet();
  stopEngines("aborted its process group");
  delegated_.fail(
      topology_.describeRank(getRank()) + " aborted its process group");
  if (auto cuda = cudaBackendIfCreated()) {
    cuda->abort();
  }
  cpuBackend_->abort();
}

void Backend::shutdown() {
  hooks_.quiet();
  stopEngines("shut down its process group");
  delegated_.fail(
      topology_.describeRank(getRank()) + " shut down its process group");
  if (auto cuda = cudaBackendIfCreated()) {
    cuda->shutdown();
  }
  cpuBackend_->shutdown();
}

} // namespace fairring
