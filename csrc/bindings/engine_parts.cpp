#include <torch_headers.h> // first: the precompiled torch headers

// The engine's parts that Python sets up or asks about without running an
// engine: the shared-memory local steps (made by fairring/_shared_memory.py),
// the plan of an all-reduce, and the staging it needs.

#include "bindings/bindings.h"

#include "device/device.h"
#include "engine/plan.h"
#include "engine/staging.h"
#include "local/shared_memory.h"

namespace py = pybind11;

namespace fairring::bindings {

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

void bindEngineParts(py::module_& module) {
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
}

} // namespace fairring::bindings
