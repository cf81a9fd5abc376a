#include <torch_headers.h> // first: the precompiled torch headers

// The product's Python module, _C: what the extension was built with, and
// each area's bindings (bindings/bindings.h), then the tests' submodule.

#include <pybind11/pybind11.h>
#include <torch/headeronly/version.h>

#include "bindings/bindings.h"
#include "device/device.h"
#include "rails/tensorpipe/factory.h"
#include "testing/bindings.h"

namespace py = pybind11;

namespace {

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

} // namespace

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

  fairring::bindings::bindSettings(module);
  fairring::bindings::bindEngineParts(module);
  fairring::bindings::bindBackend(module);

  auto testing = module.def_submodule(
      "_testing",
      "Test-only objects and functions: the harnesses, and the parts of the "
      "product that tests drive on their own.");
  fairring::testing::bindTesting(testing);
}
