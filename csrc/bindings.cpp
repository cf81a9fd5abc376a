// Python bindings: the only translation unit that includes torch/extension.h.

#include <pybind11/chrono.h>
#include <torch/extension.h>
#include <torch/headeronly/version.h>

#include "backend.h"
#include "config.h"
#include "cuda_support.h"
#include "topology.h"

namespace py = pybind11;

namespace {

py::dict buildInfo() {
  py::dict info;
  info["torch"] = std::to_string(TORCH_VERSION_MAJOR) + "." +
      std::to_string(TORCH_VERSION_MINOR) + "." +
      std::to_string(TORCH_VERSION_PATCH);
  info["cuda_path"] = fairring::cuda::isBuilt();
  auto optional = [](const std::optional<std::string>& value) -> py::object {
    return value ? py::object(py::str(*value)) : py::object(py::none());
  };
  info["cuda"] = optional(fairring::cuda::runtimeVersion());
  info["nccl"] = optional(fairring::cuda::ncclVersion());
  info["cxx_standard"] = static_cast<long>(__cplusplus);
  return info;
}

} // namespace

PYBIND11_MODULE(_C, module) {
  // Registers c10d's Backend and Store types, which ours build on.
  py::module_::import("torch.distributed");

  module.doc() = "fairring C++ extension";
  module.def(
      "build_info",
      &buildInfo,
      "What this extension was compiled with: torch, CUDA and NCCL versions "
      "and whether the CUDA path is in.");
  module.def(
      "cuda_devices_present",
      &fairring::cuda::devicesPresent,
      "Whether the CUDA path is built and a CUDA device is visible.");

  py::class_<fairring::Topology>(module, "Topology")
      .def(
          py::init<int, std::vector<std::vector<int>>>(),
          py::arg("rank"),
          py::arg("machines"))
      .def_property_readonly("rank", &fairring::Topology::rank)
      .def_property_readonly("world_size", &fairring::Topology::worldSize)
      .def_property_readonly("num_machines", &fairring::Topology::numMachines)
      .def_property_readonly("local_size", &fairring::Topology::localSize)
      .def_property_readonly("machine", &fairring::Topology::machine)
      .def_property_readonly("local_rank", &fairring::Topology::localRank)
      .def_property_readonly("local_ranks", &fairring::Topology::localRanks)
      .def_property_readonly("rail_peers", &fairring::Topology::railPeers)
      .def_property_readonly("machines", &fairring::Topology::machines)
      .def("__repr__", [](const fairring::Topology& topology) {
        return "Topology(" + topology.describe() + ")";
      });

  py::class_<fairring::Config>(module, "Config")
      .def(
          py::init([](int64_t totalMemoryBytes, int64_t sliceSizeBytes) {
            return fairring::Config{totalMemoryBytes, sliceSizeBytes};
          }),
          py::arg("total_memory_bytes"),
          py::arg("slice_size_bytes"))
      .def_readonly("total_memory_bytes", &fairring::Config::totalMemoryBytes)
      .def_readonly("slice_size_bytes", &fairring::Config::sliceSizeBytes);

  py::class_<
      fairring::Backend,
      c10d::Backend,
      c10::intrusive_ptr<fairring::Backend>>(module, "Backend")
      .def(
          py::init<
              c10::intrusive_ptr<c10d::Store>,
              fairring::Topology,
              fairring::Config,
              std::chrono::milliseconds,
              c10::intrusive_ptr<c10d::Backend>>(),
          py::arg("store"),
          py::arg("topology"),
          py::arg("config"),
          py::arg("timeout"),
          py::arg("cpu_backend"),
          py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("topology", &fairring::Backend::topology)
      .def_property_readonly("config", &fairring::Backend::config)
      .def_property_readonly("timeout", &fairring::Backend::timeout);
}
