#include <torch_headers.h> // first: the precompiled torch headers

// The product's Python module, _C (the test-only objects: _C._testing,
// testing/bindings.cpp).

#include "bindings_shared.h"

#include <type_traits>

#include <pybind11/chrono.h>
#include <torch/extension.h>
#include <torch/headeronly/version.h>

#include "backend/backend.h"
#include "backend/pending_report.h"
#include "backend/reconfigurable.h"
#include "config.h"
#include "device/device.h"
#include "engine/plan.h"
#include "reduction.h"
#include "engine/staging.h"
#include "local/shared_memory.h"
#include "rails/interfaces.h"
#include "rails/tensorpipe/factory.h"
#include "testing/bindings.h"
#include "topology.h"

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

py::dict buildInfo() {
  py::dict info;
  info["torch"] = std::to_string(TORCH_VERSION_MAJOR) + "." +
      std::to_string(TORCH_VERSION_MINOR) + "." +
      std::to_string(TORCH_VERSION_PATCH);
  info["cuda_path"] = fairring::cudaPathBuilt();
  info["cuda"] = fairring::cudaPathBuilt()
      ? py::object(py::str(fairring::cudaRuntimeVersion()))
      : py::object(py::none());
  info["tensorpipe"] = fairring::rails::tensorpipeBuilt();
  info["cxx_standard"] = static_cast<long>(__cplusplus);
  return info;
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

namespace fairring {

py::dict stagingDict(const StagingStats& stats) {
  py::dict result;
  result["capacity_bytes"] = stats.capacityBytes;
  result["bytes_in_use"] = stats.bytesInUse;
  result["peak_bytes_in_use"] = stats.peakBytesInUse;
  result["leases_in_use"] = stats.leasesInUse;
  result["peak_leases_in_use"] = stats.peakLeasesInUse;
  result["leases_granted"] = stats.leasesGranted;
  return result;
}

} // namespace fairring

PYBIND11_MODULE(_C, module) {
  // Registers c10d's Backend and Store types, which ours build on.
  py::module_::import("torch.distributed");

  module.doc() = "fairring C++ extension";
  module.def(
      "build_info",
      &buildInfo,
      "What this extension was compiled with: the torch and CUDA versions "
      "and whether the CUDA path is in (fairring.build_info() adds torch's "
      "NCCL).");
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

  py::class_<
      fairring::SharedMemorySteps,
      std::shared_ptr<fairring::SharedMemorySteps>>(
      module,
      "SharedMemorySteps",
      "This rank's side of its machine's shared-memory local steps (CPU): "
      "create, publish name, attach(every rank's name), unlink() once every "
      "rank has attached; then give it to the engine.")
      .def(
          py::init<int, std::vector<int>>(),
          py::arg("local_rank"),
          py::arg("ranks"),
          "Creates and allocates this rank's segment; raises RuntimeError, "
          "saying why, where it cannot be.")
      .def_property_readonly(
          "segment_name", &fairring::SharedMemorySteps::segmentName)
      .def(
          "attach",
          &fairring::SharedMemorySteps::attach,
          py::arg("names"),
          py::call_guard<py::gil_scoped_release>())
      .def("unlink", &fairring::SharedMemorySteps::unlink)
      .def("abort", &fairring::SharedMemorySteps::abort)
      .def_property_readonly_static("segment_bytes", [](const py::object&) {
        return fairring::SharedMemorySteps::segmentBytes();
      });

  py::class_<fairring::Topology>(module, "Topology")
      .def(
          py::init<int, std::vector<std::vector<int>>>(),
          py::arg("rank"),
          py::arg("machines"),
          "From the whole layout (tests and tools).")
      .def(
          py::init<
              int,
              int,
              int,
              std::vector<int>,
              std::vector<int>,
              std::vector<int>>(),
          py::arg("rank"),
          py::arg("world_size"),
          py::arg("machine"),
          py::arg("local_ranks"),
          py::arg("rail_peers"),
          py::arg("machine_sizes"),
          "From one rank's view, as the rendezvous gives it.")
      .def_property_readonly("rank", &fairring::Topology::rank)
      .def_property_readonly("world_size", &fairring::Topology::worldSize)
      .def_property_readonly("num_machines", &fairring::Topology::numMachines)
      .def_property_readonly("local_size", &fairring::Topology::localSize)
      .def_property_readonly("regular", &fairring::Topology::regular)
      .def_property_readonly("serves_engine", &fairring::Topology::servesEngine)
      .def_property_readonly("machine", &fairring::Topology::machine)
      .def_property_readonly("local_rank", &fairring::Topology::localRank)
      .def_property_readonly("local_ranks", &fairring::Topology::localRanks)
      .def_property_readonly("rail_peers", &fairring::Topology::railPeers)
      .def_property_readonly("machine_sizes", &fairring::Topology::machineSizes)
      .def("machine_of", &fairring::Topology::machineOf, py::arg("rank"))
      .def("local_index_of", &fairring::Topology::localIndexOf, py::arg("rank"))
      .def("__repr__", [](const fairring::Topology& topology) {
        return "Topology(" + topology.describe() + ")";
      });

  py::class_<fairring::RailsNetwork>(module, "RailsNetwork")
      .def(
          py::init([](std::string listenAddress,
                      std::string interfaceName,
                      std::vector<std::string> spareInterfaces,
                      std::vector<std::string> spareAddresses,
                      bool railFailover,
                      std::vector<std::string> transports,
                      std::vector<std::string> cpuChannels,
                      std::vector<std::string> cudaChannels,
                      std::vector<std::string> gpuDirectNics,
                      std::vector<std::string> required,
                      std::string transport,
                      std::string nixlBackend,
                      std::string nixlLibrary) {
            return fairring::RailsNetwork{
                std::move(listenAddress),
                std::move(interfaceName),
                std::move(spareInterfaces),
                std::move(spareAddresses),
                railFailover,
                std::move(transports),
                std::move(cpuChannels),
                std::move(cudaChannels),
                std::move(gpuDirectNics),
                std::move(required),
                std::move(transport),
                std::move(nixlBackend),
                std::move(nixlLibrary)};
          }),
          py::arg("listen_address") = "127.0.0.1",
          py::arg("interface_name") = "lo",
          py::arg("spare_interfaces") = std::vector<std::string>{},
          py::arg("spare_addresses") = std::vector<std::string>{},
          py::arg("rail_failover") = false,
          py::arg("transports") = std::vector<std::string>{"uv"},
          py::arg("cpu_channels") = std::vector<std::string>{"basic"},
          py::arg("cuda_channels") = std::vector<std::string>{"cuda_basic"},
          py::arg("gpu_direct_nics") = std::vector<std::string>{},
          py::arg("required") = std::vector<std::string>{},
          py::arg("transport") = "tensorpipe",
          py::arg("nixl_backend") = "UCX",
          py::arg("nixl_library") = "",
          "How the rails reach their peers (chosen by fairring.interfaces "
          "and fairring.transports); the default is loopback TCP.")
      .def_readonly("listen_address", &fairring::RailsNetwork::listenAddress)
      .def_readonly("interface_name", &fairring::RailsNetwork::interfaceName)
      .def_readonly(
          "spare_interfaces", &fairring::RailsNetwork::spareInterfaces)
      .def_readonly("spare_addresses", &fairring::RailsNetwork::spareAddresses)
      .def_readonly("rail_failover", &fairring::RailsNetwork::railFailover)
      .def_readonly("transports", &fairring::RailsNetwork::transports)
      .def_readonly("cpu_channels", &fairring::RailsNetwork::cpuChannels)
      .def_readonly("cuda_channels", &fairring::RailsNetwork::cudaChannels)
      .def_readonly("gpu_direct_nics", &fairring::RailsNetwork::gpuDirectNics)
      .def_readonly("required", &fairring::RailsNetwork::required)
      .def_readonly("transport", &fairring::RailsNetwork::transport)
      .def_readonly("nixl_backend", &fairring::RailsNetwork::nixlBackend)
      .def_readonly("nixl_library", &fairring::RailsNetwork::nixlLibrary);

  py::class_<fairring::Config>(module, "Config")
      .def_static(
          "from_settings",
          [](const py::object& settings, fairring::RailsNetwork network) {
            // The one place where fairring.config.Config's names meet the
            // C++ ones (config.h).
            fairring::Config config;
            const auto integer = [&](const char* name) {
              return settings.attr(name).cast<int64_t>();
            };
            config.totalMemoryBytes = integer("total_memory");
            config.sliceSizeBytes = integer("slice_size");
            config.maxSlicesInFlight = integer("slices_in_flight");
            config.minShardBytes = integer("min_shard");
            config.cpuFlatThresholdBytes = integer("cpu_flat_threshold");
            config.cudaFlatThresholdBytes = integer("cuda_flat_threshold");
            config.network = std::move(network);
            config.cudaEngine =
                settings.attr("cuda_engine_in_use").cast<bool>();
            config.highPriorityStreams =
                settings.attr("high_priority_streams").cast<bool>();
            const py::object timeline = settings.attr("timeline_directory");
            if (!timeline.is_none()) {
              config.timelineDirectory = timeline.cast<std::string>();
            }
            return config;
          },
          py::arg("settings"),
          py::arg("network") = fairring::RailsNetwork{},
          "The C++ side of a fairring.config.Config, with the rails' network "
          "(default: loopback TCP).")
      .def_readonly("total_memory_bytes", &fairring::Config::totalMemoryBytes)
      .def_readonly(
          "max_slices_in_flight", &fairring::Config::maxSlicesInFlight)
      .def_readonly("slice_size_bytes", &fairring::Config::sliceSizeBytes)
      .def_readonly("min_shard_bytes", &fairring::Config::minShardBytes)
      .def_readonly(
          "cpu_flat_threshold_bytes", &fairring::Config::cpuFlatThresholdBytes)
      .def_readonly(
          "cuda_flat_threshold_bytes",
          &fairring::Config::cudaFlatThresholdBytes)
      .def_readonly("network", &fairring::Config::network)
      .def_readonly("cuda_engine", &fairring::Config::cudaEngine)
      .def_readonly(
          "high_priority_streams", &fairring::Config::highPriorityStreams)
      .def_readonly("timeline_directory", &fairring::Config::timelineDirectory);

  module.def(
      "interface_addresses",
      [] {
        std::vector<py::dict> listed;
        for (const auto& address : fairring::rails::interfaceAddresses()) {
          py::dict entry;
          entry["name"] = address.name;
          entry["family"] = address.ipv6 ? "ipv6" : "ipv4";
          entry["address"] = address.address;
          entry["up"] = address.up;
          entry["loopback"] = address.loopback;
          entry["link_local"] = address.linkLocal;
          listed.push_back(std::move(entry));
        }
        return listed;
      },
      "Every IPv4 and IPv6 address of this host's interfaces, in "
      "getifaddrs() order: [{name, family, address, up, loopback, "
      "link_local}].");
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
  module.attr("CUDA_MIN_SHARD_BYTES") = fairring::kCudaMinShardBytes;
  module.def(
      "plan_shape",
      [](int64_t numel,
         int64_t elementSize,
         int localSize,
         int machines,
         int64_t transportMinShardBytes,
         int64_t maxSliceBytes,
         int64_t minShardBytes,
         int64_t totalMemoryBytes,
         int64_t maxSlicesInFlight) {
        const fairring::PlanSettings settings{
            localSize,
            machines,
            transportMinShardBytes,
            maxSliceBytes,
            minShardBytes,
            totalMemoryBytes,
            maxSlicesInFlight};
        const auto shape = fairring::planShape(numel, elementSize, settings);
        py::dict result;
        result["unit"] = shape.unit;
        result["slice_numel"] = shape.sliceNumel;
        result["slices"] = shape.slices;
        result["shard_bytes"] = shape.shardBytes;
        result["staging_bytes"] = shape.stagingBytes;
        result["slices_in_flight"] = shape.slicesInFlight;
        result["below_floor"] = shape.belowFloor;
        result["staging_capacity"] = fairring::stagingCapacity(settings);
        return result;
      },
      py::arg("numel"),
      py::arg("element_size"),
      py::arg("local_size"),
      py::arg("machines"),
      py::arg("transport_min_shard_bytes"),
      py::arg("max_slice_bytes"),
      py::arg("min_shard_bytes"),
      py::arg("total_memory_bytes"),
      py::arg("max_slices_in_flight"),
      "The engine's plan for an all-reduce of `numel` elements "
      "(engine/plan.h), "
      "computed without running it.");
  module.def(
      "staging_bytes_for",
      [](int64_t sliceBytes, int localSize, int machines, bool padded) {
        return fairring::stagingLayoutFor(
                   sliceBytes, localSize, machines, padded)
            .bytes;
      },
      py::arg("slice_bytes"),
      py::arg("local_size"),
      py::arg("machines"),
      py::arg("padded") = true,
      "Staging bytes one slice of `slice_bytes` holds while in flight; "
      "padded (the default, the most any slice needs): a last slice padded "
      "to the plan's unit.");
  module.def(
      "slice_bytes_for",
      &fairring::sliceBytesFor,
      py::arg("tensor_bytes"),
      py::arg("max_slice_bytes"),
      "The slice size the engine uses for an all-reduce of `tensor_bytes`.");

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
              rows.append(std::move(entry));
            }
            return rows;
          },
          "What the group's all-reduces, reduce-scatters and all-gathers "
          "went through (backend/usage.h), one dict per device, collective "
          "and path ('engine' or 'delegate') that counted an op: ops, bytes "
          "(of the N-chunk tensors), timed_ops and timed_bytes (those whose "
          "time is in busy_s), busy_s (seconds with at least one in flight) "
          "and by_size: (smallest bytes of the power-of-two bucket, ops, "
          "bytes). fairring.summary() reads it.")
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
                backend, device, [](const fairring::Engine& engine) {
                  return py::str(engine.describeRails());
                });
          },
          py::arg("device") = "cpu",
          "Where the engine for `device` listens, its transports and "
          "channels, and the connections its listener rejected (how many, "
          "and why for the first few); None where there is no engine.")
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

  auto testing = module.def_submodule(
      "_testing",
      "Test-only objects and functions: the harnesses, and the parts of the "
      "product that tests drive on their own.");
  fairring::testing::bindTesting(testing);
}
