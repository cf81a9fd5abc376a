#include <torch_headers.h> // first: the precompiled torch headers

// The settings' bindings: a rank's Topology, its rails' RailsNetwork, the
// C++ Config made from fairring._config's, and the host's interfaces.

#include "bindings/bindings.h"

#include "config.h"
#include "log.h"
#include "rails/interfaces.h"
#include "test_switches.h"
#include "topology.h"

namespace py = pybind11;

namespace fairring::bindings {

void bindSettings(py::module_& module) {
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
                      std::string nixlLibrary,
                      std::string secret,
                      bool encrypt) {
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
                std::move(nixlLibrary),
                std::move(secret),
                encrypt};
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
          py::arg("secret") = "",
          py::arg("encrypt") = false,
          "How the rails reach their peers (chosen by fairring._interfaces "
          "and fairring._transports); the default is loopback TCP. `secret`: "
          "FAIRRING_RAILS_SECRET (write-only: nothing reads it back).")
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
      .def_readonly("encrypt", &fairring::RailsNetwork::encrypt)
      .def_readonly("transport", &fairring::RailsNetwork::transport)
      .def_readonly("nixl_backend", &fairring::RailsNetwork::nixlBackend)
      .def_readonly("nixl_library", &fairring::RailsNetwork::nixlLibrary);

  py::class_<fairring::Config>(module, "Config")
      .def_static(
          "from_settings",
          [](const py::object& settings, fairring::RailsNetwork network) {
            // The one place where fairring._config.Config's names meet the
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
            config.cudaStreamHold =
                settings.attr("cuda_wait").cast<std::string>() == "stream";
            const py::object timeline = settings.attr("timeline_directory");
            if (!timeline.is_none()) {
              config.timelineDirectory = timeline.cast<std::string>();
            }
            return config;
          },
          py::arg("settings"),
          py::arg("network") = fairring::RailsNetwork{},
          "The C++ side of a fairring._config.Config, with the rails' network "
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
      .def_readonly("cuda_stream_hold", &fairring::Config::cudaStreamHold)
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
      "set_log_level",
      [](std::optional<int> level, int rank) {
        TORCH_CHECK(
            !level || (*level >= 0 && *level <= 3),
            "fairring: log level ",
            *level,
            " is none of 0 (DEBUG) to 3 (ERROR)");
        fairring::setLogLevel(
            level ? std::optional<fairring::LogLevel>(
                        static_cast<fairring::LogLevel>(*level))
                  : std::nullopt,
            rank);
      },
      py::arg("level"),
      py::arg("rank"),
      "FAIRRING_LOG_LEVEL for the C++ notices (0 DEBUG .. 3 ERROR; None: "
      "unset, c10's logging and TORCH_CPP_LOG_LEVEL decide), and the rank "
      "their lines name (-1: unknown); fairring._log calls it.");

  module.def(
      "test_switch",
      [](const std::string& suffix) {
        return fairring::testSwitch(std::string_view(suffix));
      },
      py::arg("suffix"),
      "The test suite's switch FAIRRING_TEST_<suffix>, or None where unset "
      "or empty (csrc/test_switches.h lists them).");
}

} // namespace fairring::bindings
