#include <torch_headers.h> // first: the precompiled torch headers

// The backend's bindings: fairring.Backend (made by fairring/_registration.py
// with a Python InnerGroupFactory) and its accessors, the reconfigurable
// group, and the process-wide reports of pending and failed work.

#include "bindings/bindings.h"

#include <type_traits>

#include <pybind11/chrono.h>

#include "backend/backend.h"
#include "backend/pending_report.h"
#include "backend/reconfigurable.h"
#include "local/shared_memory.h"

namespace py = pybind11;

namespace {

// The holder of Python's reference to a Backend. It lets go of the GIL
// before dropping the reference: a backend's destructor joins threads (its
// Gloo group's) that may need the GIL to finish their last work, so a
// destructor run with the GIL held (destroy_process_group) would deadlock.
template <typename T>
class ReleasesGilOnDrop {
 public:
  ReleasesGilOnDrop() = default;
  explicit ReleasesGilOnDrop(c10::intrusive_ptr<T> target)
      : target_(std::move(target)) {}
  // pybind11 adopts objects it did not make this way.
  explicit ReleasesGilOnDrop(T* target)
      : target_(c10::intrusive_ptr<T>::reclaim_copy(target)) {}
  ReleasesGilOnDrop(const ReleasesGilOnDrop&) = default;
  ReleasesGilOnDrop& operator=(const ReleasesGilOnDrop&) = default;
  ~ReleasesGilOnDrop() {
    if (target_ && PyGILState_Check()) {
      py::gil_scoped_release noGil;
      target_.reset();
    }
  }

  T* get() const noexcept {
    return target_.get();
  }

 private:
  c10::intrusive_ptr<T> target_;
};

} // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, ReleasesGilOnDrop<T>, true)

namespace {

// The kind fairring::collectiveName() names.
fairring::Collective collectiveNamed(const std::string& name) {
  for (auto kind :
       {fairring::Collective::kAllReduce,
        fairring::Collective::kReduceScatter,
        fairring::Collective::kAllGather}) {
    if (name == fairring::collectiveName(kind)) {
      return kind;
    }
  }
  TORCH_CHECK(
      false,
      "fairring: unknown collective '",
      name,
      "'; use 'all_reduce', 'reduce_scatter' or 'all_gather'");
}

// The InnerGroupFactory that fairring/_registration.py implements in Python.
// Called from whatever thread issues a collective, without the GIL.
class PyInnerGroupFactory final : public fairring::InnerGroupFactory {
 public:
  explicit PyInnerGroupFactory(py::object factory)
      : factory_(std::move(factory)) {}
  ~PyInnerGroupFactory() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      factory_ = py::object();
    } else {
      factory_.release(); // the interpreter is gone: nothing to release to
    }
  }

  c10::intrusive_ptr<c10d::Backend> delegate(c10::DeviceType type) override {
    return call([&] {
      return factory_
          .attr("delegate")(c10::DeviceTypeName(type, /*lower_case=*/true))
          .cast<c10::intrusive_ptr<c10d::Backend>>();
    });
  }

  void engineMade(
      c10::Device device,
      const std::string& rails,
      const std::string& held) override {
    call([&] { factory_.attr("engine_made")(device.str(), rails, held); });
  }

  std::vector<std::vector<int>> layout() override {
    return call([&] {
      return factory_.attr("layout")().cast<std::vector<std::vector<int>>>();
    });
  }

  void noticeOnce(const std::string& text) override {
    call([&] { factory_.attr("notice_once")(text); });
  }

  void shuttingDown(const c10::intrusive_ptr<c10d::Backend>& backend) override {
    if (!Py_IsInitialized()) {
      return;
    }
    try {
      call([&] { factory_.attr("shutting_down")(backend); });
    } catch (const std::exception&) {
      // the summary is a courtesy: never a reason for shutdown to fail
    }
  }

  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::vector<int>& ranks,
      std::chrono::milliseconds timeout,
      const std::string& groupName) override {
    return call([&] {
      return factory_.attr("split")(store, ranks, timeout, groupName)
          .cast<c10::intrusive_ptr<c10d::Backend>>();
    });
  }

  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int>& survivors,
      std::chrono::milliseconds timeout,
      const std::string& key,
      c10::intrusive_ptr<c10d::Backend> cudaDelegate) override {
    return call([&] {
      const py::object delegate = cudaDelegate
          ? py::cast(std::move(cudaDelegate))
          : py::object(py::none());
      return factory_.attr("shrink")(survivors, timeout, key, delegate)
          .cast<c10::intrusive_ptr<c10d::Backend>>();
    });
  }

  fairring::MeasuredThreshold measureFlatThreshold(
      c10::Device device,
      fairring::Collective kind,
      fairring::CollectiveOnPath run) override {
    return call([&] {
      // Called from Python, which holds the GIL; the collective does not.
      py::cpp_function runOn(
          [run](at::Tensor output, at::Tensor input, bool onEngine) {
            py::gil_scoped_release noGil;
            run(output, input, onEngine);
          },
          py::arg("output"),
          py::arg("input"),
          py::arg("on_engine"));
      const py::object decided = factory_.attr("measure_flat_threshold")(
          device.str(), fairring::collectiveName(kind), runOn);
      fairring::MeasuredThreshold measured;
      measured.thresholdBytes = decided.attr("threshold").cast<int64_t>();
      measured.ceilingBytes = decided.attr("ceiling").cast<int64_t>();
      measured.reason = decided.attr("reason").cast<std::string>();
      measured.source = decided.attr("source").cast<std::string>();
      for (const auto& size : decided.attr("sizes")) {
        measured.sizes.push_back(
            {size.attr("nbytes").cast<int64_t>(),
             size.attr("engine_s").cast<double>(),
             size.attr("delegate_s").cast<double>()});
      }
      return measured;
    });
  }

  fairring::LocalGroups localGroups(c10::Device device) override {
    return call([&] {
      auto groups =
          factory_.attr("local_groups")(device.str()).cast<py::tuple>();
      fairring::LocalGroups result;
      if (!groups[0].is_none()) {
        result.reduceScatter =
            groups[0].cast<c10::intrusive_ptr<c10d::Backend>>();
        result.allGather = groups[1].cast<c10::intrusive_ptr<c10d::Backend>>();
      }
      if (!groups[2].is_none()) {
        result.sharedMemory =
            groups[2].cast<std::shared_ptr<fairring::SharedMemorySteps>>();
      }
      return result;
    });
  }

 private:
  // Python errors become C++ ones while the GIL is held: an
  // error_already_set must not outlive it.
  template <typename Call>
  std::invoke_result_t<Call> call(Call&& body) {
    py::gil_scoped_acquire gil;
    try {
      return body();
    } catch (py::error_already_set& error) {
      throw std::runtime_error(error.what());
    }
  }

  py::object factory_;
};

#ifdef C10D_BACKEND_HAS_RECONFIGURE
// reconfigure()'s maker of fairring backends, in Python
// (fairring/_registration.py); called without the GIL, from reconfigure.
class PyBackendMaker {
 public:
  explicit PyBackendMaker(py::object make) : make_(std::move(make)) {}
  ~PyBackendMaker() {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      make_ = py::object();
    } else {
      make_.release(); // the interpreter is gone: nothing to release to
    }
  }
  PyBackendMaker(const PyBackendMaker&) = delete;
  PyBackendMaker& operator=(const PyBackendMaker&) = delete;

  c10::intrusive_ptr<fairring::Backend> operator()(
      const c10::intrusive_ptr<c10d::Store>& store,
      int rank,
      int size,
      std::chrono::milliseconds timeout) {
    py::gil_scoped_acquire gil;
    try {
      auto made = make_(store, rank, size, timeout)
                      .cast<c10::intrusive_ptr<c10d::Backend>>();
      auto backend = c10::dynamic_intrusive_pointer_cast<fairring::Backend>(
          std::move(made));
      TORCH_CHECK(backend, "fairring: the maker made no fairring backend");
      return backend;
    } catch (py::error_already_set& error) {
      throw std::runtime_error(error.what());
    }
  }

 private:
  py::object make_;
};
#endif

// `describe(engine)` for the backend's engine on `device` ("cpu" or "cuda"),
// or None where it has none.
template <typename Describe>
py::object engineDict(
    const fairring::Backend& backend,
    const std::string& device,
    Describe&& describe) {
  TORCH_CHECK(
      device == "cpu" || device == "cuda",
      "fairring: device must be 'cpu' or 'cuda', not '",
      device,
      "'");
  const fairring::Engine* engine =
      backend.engine(device == "cpu" ? c10::kCPU : c10::kCUDA);
  return engine == nullptr ? py::object(py::none())
                           : py::object(describe(*engine));
}

} // namespace

namespace fairring::bindings {

void bindBackend(py::module_& module) {
  module.def(
      "pending_report",
      &fairring::pendingReport,
      py::call_guard<py::gil_scoped_release>(),
      "Each engine op of every fairring group of this process issued and "
      "not yet settled, one line each (fairring.pending()).");
  module.def(
      "report_pending_on_signal",
      &fairring::reportPendingOnSignal,
      py::arg("signal"),
      "From now on `signal` makes a thread of fairring's write the pending "
      "report to stderr (FAIRRING_DUMP_SIGNAL).");
  module.def(
      "await_failure_reports",
      [](double seconds) {
        return fairring::awaitFailureReports(
            std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
      },
      py::arg("seconds"),
      py::call_guard<py::gil_scoped_release>(), // a hook may need the GIL
      "Waits up to `seconds` for the abort hooks started by failures (the "
      "flight recorder's dumps) to end; False if some still run.");

  py::class_<
      fairring::Backend,
      c10d::Backend,
      ReleasesGilOnDrop<fairring::Backend>>
      backendClass(module, "Backend");
  // torch 2.11's split_group deep-copies `options`, which its c10d Backend
  // lacks and could not copy: None lets c10d ask getBackendOptions().
  if (!py::hasattr(
          py::module_::import("torch._C._distributed_c10d").attr("Backend"),
          "options")) {
    backendClass.def_property_readonly(
        "options",
        [](const fairring::Backend&) { return py::none(); },
        "None: fairring's settings are its environment variables.");
  }
  backendClass
      .def(
          py::init([](c10::intrusive_ptr<c10d::Store> store,
                      fairring::Topology topology,
                      fairring::Config config,
                      std::chrono::milliseconds timeout,
                      c10::intrusive_ptr<c10d::Backend> cpuBackend,
                      py::object innerGroups) {
            auto factory =
                std::make_shared<PyInnerGroupFactory>(std::move(innerGroups));
            py::gil_scoped_release noGil; // the factory takes it when called
            return ReleasesGilOnDrop<fairring::Backend>(
                c10::make_intrusive<fairring::Backend>(
                    std::move(store),
                    std::move(topology),
                    std::move(config),
                    timeout,
                    std::move(cpuBackend),
                    std::move(factory)));
          }),
          py::arg("store"),
          py::arg("topology"),
          py::arg("config"),
          py::arg("timeout"),
          py::arg("cpu_backend"),
          py::arg("inner_groups"),
          "inner_groups: an object with delegate(device_type: str) and "
          "local_groups(device: str) -> (reduce_scatter, all_gather, "
          "shared_memory), any of them None; see fairring/_registration.py.")
      .def(
          "staging_stats",
          [](const fairring::Backend& backend, const std::string& device) {
            return engineDict(
                backend, device, [](const fairring::Engine& engine) {
                  return stagingDict(engine.stagingStats());
                });
          },
          py::arg("device") = "cpu",
          "Staging memory of the engine for `device` ('cpu' or 'cuda'); None "
          "where there is none (before the group's first all-reduce on that "
          "device, where the group takes the flat path, or CUDA without "
          "FAIRRING_CUDA_ENGINE).")
      .def(
          "measured_threshold",
          [](const fairring::Backend& backend,
             const std::string& device,
             const std::string& collective) -> py::object {
            const auto measured = backend.measuredThreshold(
                c10::Device(device).type(), collectiveNamed(collective));
            if (!measured) {
              return py::none();
            }
            py::list sizes;
            for (const auto& size : measured->sizes) {
              py::dict row;
              row["bytes"] = size.bytes;
              row["engine_s"] = size.engineSeconds;
              row["delegate_s"] = size.delegateSeconds;
              sizes.append(std::move(row));
            }
            py::dict result;
            result["threshold"] = measured->thresholdBytes;
            result["ceiling"] = measured->ceilingBytes;
            result["reason"] = measured->reason;
            result["source"] = measured->source;
            result["sizes"] = std::move(sizes);
            return std::move(result);
          },
          py::arg("device") = "cpu",
          py::arg("collective") = "all_reduce",
          "What FAIRRING_FLAT_THRESHOLD=auto decided for `device` tensors' "
          "`collective` ('all_reduce', 'reduce_scatter' or 'all_gather'): "
          "the threshold, why, whether measured or from the cache, and the "
          "sweep (seconds on each path by size); None before it is measured "
          "or where the threshold is set.")
      .def(
          "engine_stats",
          [](const fairring::Backend& backend, const std::string& device) {
            return engineDict(
                backend, device, [&](const fairring::Engine& engine) {
                  const auto stats = engine.stats();
                  py::dict result;
                  result["ops"] = stats.ops;
                  result["slices"] = stats.slices;
                  result["flat_ops"] =
                      backend.belowThresholdAllreduces(engine.device().type());
                  result["rail_bytes_sent"] = stats.railBytesSent;
                  result["rail_bytes_received"] = stats.railBytesReceived;
                  result["local_steps"] = stats.localSteps;
                  result["local_steps_state"] = engine.localStepsState();
                  py::dict byCollective;
                  for (auto kind :
                       {fairring::Collective::kAllReduce,
                        fairring::Collective::kReduceScatter,
                        fairring::Collective::kAllGather}) {
                    const auto index = static_cast<size_t>(kind);
                    py::dict counts;
                    counts["ops"] = stats.opsByKind[index];
                    counts["bytes"] = stats.bytesByKind[index];
                    byCollective[fairring::collectiveName(kind)] = counts;
                  }
                  result["by_collective"] = byCollective;
                  return result;
                });
          },
          py::arg("device") = "cpu",
          "Counters of the engine for `device` (ops, slices, rail bytes, and "
          "by_collective: ops and bytes of the N-chunk tensors per kind); "
          "None where there is none.")
      .def(
          "usage",
          [](fairring::Backend& backend) {
            py::list rows;
            for (const fairring::UsageRow& row : backend.usage()) {
              py::dict entry;
              entry["device"] = c10::DeviceTypeName(row.deviceType, true);
              entry["collective"] = fairring::collectiveName(row.kind);
              entry["path"] = row.path == fairring::UsagePath::kEngine
                  ? "engine"
                  : "delegate";
              entry["ops"] = row.ops;
              entry["bytes"] = row.bytes;
              entry["timed_ops"] = row.timedOps;
              entry["timed_bytes"] = row.timedBytes;
              entry["busy_s"] = row.busySeconds;
              py::list bySize;
              for (size_t bucket = 0; bucket < fairring::kSizeBuckets;
                   ++bucket) {
                if (row.opsBySize[bucket] > 0) {
                  bySize.append(
                      py::make_tuple(
                          int64_t{1} << bucket,
                          row.opsBySize[bucket],
                          row.bytesBySize[bucket]));
                }
              }
              entry["by_size"] = std::move(bySize);
              py::dict byReason;
              for (size_t reason = 0; reason < fairring::kPathReasons;
                   ++reason) {
                if (row.opsByReason[reason] > 0) {
                  byReason[fairring::pathReasonName(
                      static_cast<fairring::PathReason>(reason))] =
                      row.opsByReason[reason];
                }
              }
              entry["by_reason"] = std::move(byReason);
              rows.append(std::move(entry));
            }
            return rows;
          },
          "What the group's all-reduces, reduce-scatters and all-gathers "
          "went through (backend/usage.h), one dict per device, collective "
          "and path ('engine' or 'delegate') that counted an op: ops, bytes "
          "(of the N-chunk tensors), timed_ops and timed_bytes (those whose "
          "time is in busy_s), busy_s (seconds with at least one in flight) "
          "by_size: (smallest bytes of the power-of-two bucket, ops, "
          "bytes), and by_reason: ops by why they took the path ('engine', "
          "or what kept them off it: backend/path_reason.h). "
          "fairring.summary() reads it.")
      .def(
          "path_for",
          [](const fairring::Backend& backend,
             int64_t nbytes,
             at::ScalarType dtype,
             const std::string& device,
             const std::string& collective) {
            TORCH_CHECK_VALUE(
                nbytes >= 0,
                "fairring: path_for(nbytes=",
                nbytes,
                "): give the collective's size in bytes, 0 or more");
            const auto answer = backend.pathFor(
                collectiveNamed(collective),
                nbytes,
                dtype,
                c10::Device(device));
            py::dict result;
            result["path"] = !answer.decided ? "undecided"
                : answer.onEngine            ? "engine"
                                             : "delegate";
            result["reason"] = answer.decided
                ? fairring::pathReasonName(answer.reason)
                : "to_be_measured";
            return result;
          },
          py::arg("nbytes"),
          py::arg("dtype"),
          py::arg("device") = "cpu",
          py::arg("collective") = "all_reduce",
          "The path a `collective` of one dense tensor of `nbytes` (a "
          "reduce-scatter's or all-gather's N-chunk side) of `dtype` on "
          "`device`, with SUM, would take now, and why: {'path': 'engine', "
          "'delegate' or 'undecided' (FAIRRING_FLAT_THRESHOLD=auto has not "
          "measured yet), 'reason': 'engine', what keeps it off the engine "
          "(irregular_group, captured, mixed_tensors, dtype_or_op, "
          "engine_off, cuda_engine_off, below_threshold, above_ceiling, "
          "coalescing) or 'to_be_measured'}. Decided by the functions the "
          "collective itself uses; asks nothing of the other ranks.")
      .def(
          "engine_footprint",
          [](const fairring::Backend& backend,
             const std::string& device) -> py::object {
            const auto footprint =
                backend.footprint(c10::Device(device).type());
            if (!footprint) {
              return py::none();
            }
            py::dict result;
            result["device"] = footprint->device;
            result["staging_bytes"] = footprint->stagingBytes;
            result["pinned_host_bytes"] = footprint->pinnedHostBytes;
            result["connections"] = footprint->connections;
            result["added_threads"] = footprint->addedThreads;
            result["added_descriptors"] = footprint->addedDescriptors;
            result["added_device_bytes"] = footprint->addedDeviceBytes;
            result["summary"] = footprint->describe();
            return std::move(result);
          },
          py::arg("device") = "cpu",
          "What the engine for `device` holds (staging, the rails' pinned "
          "host memory, connections) and what making it added to the process "
          "(threads, descriptors, device memory); None until it is made.")
      .def(
          "rails",
          [](const fairring::Backend& backend, const std::string& device) {
            return engineDict(
                backend, device, [&](const fairring::Engine& engine) {
                  const fairring::RailsNetwork& network =
                      backend.config().network;
                  py::dict result;
                  result["transport"] = network.transport;
                  result["interface"] = network.interfaceName;
                  result["address"] = network.listenAddress;
                  result["spare_interfaces"] = network.spareInterfaces;
                  result["description"] = engine.describeRails();
                  return result;
                });
          },
          py::arg("device") = "cpu",
          "The rails of the engine for `device`: transport ('tensorpipe' or "
          "'nixl'), the interface and address they listen on, the spare "
          "interfaces failover may move them to, and a description of what "
          "the mesh registered (transports, channels), the connections its "
          "listener refused (how many, and why for the first few) and the "
          "failover's state; None where there is no engine.")
      .def(
          "perform_nocolor_split",
          [](const fairring::Backend&, const py::object& /*device*/) {},
          py::arg("device"),
          "Called by torch on ranks left out of a new group split from this "
          "one: fairring's splits need nothing from them.")
      .def_property_readonly(
          "failure",
          &fairring::Backend::failure,
          "The sentence that names the group's failure, as its ops' errors "
          "give it; empty while nothing has failed.")
      .def_property_readonly("topology", &fairring::Backend::topology)
      .def_property_readonly("config", &fairring::Backend::config)
      .def_property_readonly("timeout", &fairring::Backend::timeout);

#ifdef C10D_BACKEND_HAS_RECONFIGURE
  py::class_<
      fairring::ReconfigurableBackend,
      c10d::Backend,
      ReleasesGilOnDrop<fairring::ReconfigurableBackend>>(
      module, "ReconfigurableBackend")
      .def(
          py::init([](c10::intrusive_ptr<c10d::Store> store,
                      int rank,
                      int size,
                      std::chrono::milliseconds timeout,
                      py::object makeBackend) {
            auto maker =
                std::make_shared<PyBackendMaker>(std::move(makeBackend));
            return ReleasesGilOnDrop<fairring::ReconfigurableBackend>(
                c10::make_intrusive<fairring::ReconfigurableBackend>(
                    std::move(store),
                    rank,
                    size,
                    timeout,
                    [maker](
                        const c10::intrusive_ptr<c10d::Store>& groupStore,
                        int newRank,
                        int newSize,
                        std::chrono::milliseconds newTimeout) {
                      return (*maker)(groupStore, newRank, newSize, newTimeout);
                    }));
          }),
          py::arg("store"),
          py::arg("rank"),
          py::arg("size"),
          py::arg("timeout"),
          py::arg("make_backend"),
          "A group made with enable_reconfigure=True; make_backend(store, "
          "rank, size, timeout) makes the fairring Backend of each member "
          "set.")
      .def_property_readonly(
          "current",
          &fairring::ReconfigurableBackend::current,
          "The Backend of the current members; raises before the first "
          "reconfigure.");
#endif
}

} // namespace fairring::bindings
