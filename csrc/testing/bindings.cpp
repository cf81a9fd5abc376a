#include <torch_headers.h> // first: the precompiled torch headers

// _C._testing: what the tests drive that the product does not use: the
// path decisions, the collective ledger, the staging allocator, the launch
// order, plan arithmetic and the local steps on their own, and the switches
// of the negative controls; the rails' formats (testing/rails_bindings.cpp)
// and the TensorPipe harnesses (testing/tensorpipe_bindings.cpp).

#include "testing/bindings.h"

#include <chrono>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>

#include <pybind11/chrono.h>
#include <torch/extension.h>

#include "backend/allreduce_path.h"
#include "backend/backend.h"
#include "backend/delegated.h"
#include "backend/ledger.h"
#include "backend/memory_order.h"
#include "backend/usage.h"
#include "backend/work.h"
#include "bindings/bindings.h"
#include "device/capture.h"
#include "device/emulated.h"
#include "engine/launch_order.h"
#include "engine/plan.h"
#include "reduction.h"
#include "engine/staging.h"
#include "local/group_steps.h"
#include "local/shared_memory.h"
#include "log.h"
#include "rails/tensorpipe/factory.h"
#include "testing/recording_group.h"

namespace py = pybind11;

namespace fairring::testing {

namespace {

// An op by the name Python gives it ("sum", "max", ...), among `ops`.
c10d::ReduceOp::RedOpType opNamed(
    const std::string& name,
    std::initializer_list<c10d::ReduceOp::RedOpType> ops) {
  for (auto op : ops) {
    if (name == reduceOpName(op)) {
      return op;
    }
  }
  throw std::invalid_argument("not an op here: " + name);
}

// A local step's op by the name Python gives it.
c10d::ReduceOp::RedOpType localOpNamed(const std::string& name) {
  return opNamed(
      name,
      {c10d::ReduceOp::SUM,
       c10d::ReduceOp::MAX,
       c10d::ReduceOp::MIN,
       c10d::ReduceOp::PRODUCT});
}

} // namespace

void bindTesting(py::module_& testing) {
  // A C++ notice, as the failover's and the local groups' are logged.
  testing.def(
      "log",
      [](int level, const std::string& text) {
        TORCH_CHECK(
            level >= 0 && level <= 3,
            "fairring: log level ",
            level,
            " is none of 0 (DEBUG) to 3 (ERROR)");
        fairring::notice(static_cast<fairring::LogLevel>(level), text);
      },
      py::arg("level"),
      py::arg("text"));
  // What counting and timing one op costs the funnel (backend/usage.h):
  // `ops` starts and counts of a CPU op whose Work has completed, so its
  // callback runs and its interval is folded in, as a fast op's would be.
  testing.def(
      "usage_seconds_per_op",
      [](int64_t ops) {
        auto future = c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()));
        future->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
        const c10::intrusive_ptr<c10d::Work> work =
            c10::make_intrusive<fairring::FutureWork>(
                future,
                c10d::OpType::ALLREDUCE,
                "usage",
                0,
                std::vector<at::Tensor>{});
        fairring::Usage usage;
        py::gil_scoped_release noGil;
        const auto started = std::chrono::steady_clock::now();
        for (int64_t op = 0; op < ops; ++op) {
          const auto interval = usage.start(c10::Device(c10::kCPU), true);
          usage.count(
              interval,
              fairring::Collective::kAllReduce,
              fairring::UsagePath::kDelegate,
              fairring::PathReason::kBelowThreshold,
              4,
              work);
        }
        const std::chrono::duration<double> took =
            std::chrono::steady_clock::now() - started;
        const auto rows = usage.rows();
        TORCH_CHECK(
            rows.size() == 1 && rows[0].ops == ops && rows[0].timedOps == ops,
            "usage_seconds_per_op: every op must be counted and timed");
        return took.count() / static_cast<double>(ops);
      },
      py::arg("ops"),
      "Seconds one op's counting and timing costs the funnel.");

  // The all-reduce's path decision on its own (backend/allreduce_path.h).
  testing.def(
      "allreduce_path",
      [](const std::string& device,
         const at::Tensor& dtypeOf,
         const std::string& op,
         int64_t bytes,
         size_t tensorCount,
         bool uniform,
         bool coalesced,
         bool ncclMisreadsPremulFactor,
         bool nativeBlockOpen,
         bool servesEngine,
         const Config& config,
         bool captured,
         bool withReason) {
        AllreduceArgs args;
        args.deviceType = c10::Device(device).type();
        args.dtype = dtypeOf.scalar_type();
        args.op = opNamed(
            op,
            {c10d::ReduceOp::SUM,
             c10d::ReduceOp::AVG,
             c10d::ReduceOp::PRODUCT,
             c10d::ReduceOp::MIN,
             c10d::ReduceOp::MAX,
             c10d::ReduceOp::BAND,
             c10d::ReduceOp::BOR,
             c10d::ReduceOp::BXOR,
             c10d::ReduceOp::PREMUL_SUM});
        args.bytes = bytes;
        args.tensorCount = tensorCount;
        args.uniform = uniform;
        args.packable = coalesced;
        args.canPremultiply = !coalesced;
        args.ncclMisreadsPremulFactor = ncclMisreadsPremulFactor;
        args.nativeBlockOpen = nativeBlockOpen;
        args.captured = captured;
        const AllreduceRoute route = chooseAllreducePath(
            args,
            servesEngine,
            config,
            EngineSizes{
                config.flatThresholdBytes(args.deviceType != c10::kCPU)});
        const char* path = route.path == AllreducePath::kEngine ? "engine"
            : route.path == AllreducePath::kDelegateBelowThreshold
            ? "delegate below threshold"
            : "delegate";
        if (withReason) {
          return py::tuple(
              py::make_tuple(
                  path, route.premultiplyHere, pathReasonName(route.reason)));
        }
        return py::tuple(py::make_tuple(path, route.premultiplyHere));
      },
      py::arg("device"),
      py::arg("dtype_of"),
      py::arg("op"),
      py::arg("bytes"),
      py::arg("tensor_count"),
      py::arg("uniform"),
      py::arg("coalesced"),
      py::arg("nccl_misreads_premul_factor"),
      py::arg("native_block_open"),
      py::arg("serves_engine"),
      py::arg("config"),
      py::arg("captured") = false,
      py::arg("with_reason") = false);

  bindRailsTesting(testing);

  // The collective ledger's comparisons, for tests; a disagreement is
  // (neighbour, seq, mine, theirs).
  using fairring::CollectiveLedger;
  const auto disagreement =
      [](const std::optional<CollectiveLedger::Disagreement>& found)
      -> py::object {
    if (!found) {
      return py::none();
    }
    return py::make_tuple(
        found->neighbour, found->seq, found->mine, found->theirs);
  };
  py::class_<CollectiveLedger>(testing, "CollectiveLedger")
      .def(py::init<>())
      .def(
          "record",
          [disagreement](CollectiveLedger& ledger, std::string signature) {
            std::optional<CollectiveLedger::Disagreement> found;
            const uint64_t seq = ledger.record(std::move(signature), found);
            return py::make_tuple(seq, disagreement(found));
          },
          py::arg("signature"),
          "Records the next collective: (its number, a disagreement with an "
          "early report of it, or None).")
      .def("report", &CollectiveLedger::report)
      .def(
          "compare",
          [disagreement](
              CollectiveLedger& ledger,
              int neighbour,
              const std::string& report) {
            return disagreement(ledger.compare(neighbour, report));
          },
          py::arg("neighbour"),
          py::arg("report"));
  // The engine's staging allocator, on its own, for tests.
  using fairring::StagingRing;
  py::class_<StagingRing::Lease>(testing, "StagingLease")
      .def_property_readonly("offset", &StagingRing::Lease::offset)
      .def_property_readonly("size", &StagingRing::Lease::size)
      .def("release", &StagingRing::Lease::release);
  py::class_<StagingRing>(testing, "StagingRing")
      .def(
          py::init([](int64_t capacityBytes) {
            return std::make_unique<StagingRing>(
                capacityBytes, at::TensorOptions().device(at::kCPU));
          }),
          py::arg("capacity_bytes"))
      .def(
          "try_acquire",
          [](StagingRing& ring, int64_t bytes, bool emptyRing) {
            auto lease = ring.tryAcquire(
                bytes,
                emptyRing ? StagingRing::Placement::kEmptyRing
                          : StagingRing::Placement::kAnywhere);
            return lease
                ? std::make_unique<StagingRing::Lease>(std::move(*lease))
                : nullptr;
          },
          py::arg("bytes"),
          py::arg("empty_ring") = false,
          py::keep_alive<0, 1>(),
          "A lease of `bytes` (rounded up to 64) if they fit now (empty_ring: "
          "only in an empty ring), else None.")
      .def("stats", [](const StagingRing& ring) {
        return bindings::stagingDict(ring.stats());
      });
  // GroupSteps over two recording groups named `backend_name` ("nccl",
  // "gloo"): their timeouts set to `timeout_ms`, then stopped by `how`
  // ("abort", "close", or "sequential_abort": each group's abort() in turn on
  // this thread, the negative control of concurrent aborts), each stop call
  // blocking up to `block_ms`; returns the seconds that stopping and join()
  // took and what the groups saw, in order.
  testing.def(
      "stop_group_steps",
      [](const std::string& backendName,
         const std::string& how,
         int64_t timeoutMs,
         int64_t blockMs) {
        auto log = std::make_shared<GroupLog>();
        log->blockFor = std::chrono::milliseconds(blockMs);
        auto reduceScatter =
            c10::make_intrusive<RecordingGroup>("rs", backendName, log);
        auto allGather =
            c10::make_intrusive<RecordingGroup>("ag", backendName, log);
        double seconds = 0;
        std::vector<std::string> events;
        {
          py::gil_scoped_release released;
          GroupSteps steps(reduceScatter, allGather);
          steps.setTimeout(std::chrono::milliseconds(timeoutMs));
          const auto start = std::chrono::steady_clock::now();
          if (how == "abort") {
            steps.abort();
          } else if (how == "close") {
            steps.close();
          } else if (how == "sequential_abort") {
            reduceScatter->abort();
            allGather->abort();
          } else {
            throw std::invalid_argument(
                "how: abort, close or sequential_abort");
          }
          steps.join();
          seconds = std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - start)
                        .count();
          events = log->snapshot();
          log->release(); // threads left to finish on their own now end
        }
        return py::make_tuple(seconds, events);
      },
      py::arg("backend_name"),
      py::arg("how"),
      py::arg("timeout_ms"),
      py::arg("block_ms"));
  testing.def(
      "staging_window",
      &fairring::stagingWindow,
      py::arg("capacity_bytes"),
      py::arg("lease_bytes"),
      "The most of these leases (in order) a ring holds at once when each "
      "waits only for the lease `window` places earlier to come back.");
  // The engine's launch order, on its own: tests drive it from two
  // "threads" that try their next step in any order.
  using fairring::LaunchOrder;
  const auto stepNamed = [](const std::string& step) {
    if (step == "rs") {
      return LaunchOrder::Step::kReduceScatter;
    }
    if (step == "ag") {
      return LaunchOrder::Step::kAllGather;
    }
    throw std::invalid_argument("a step is 'rs' or 'ag', not " + step);
  };
  py::class_<LaunchOrder>(testing, "LaunchOrder")
      .def(py::init([] {
        return std::make_unique<LaunchOrder>(/*enforced=*/true);
      }))
      .def(
          "issued",
          &LaunchOrder::issued,
          py::arg("op"),
          py::arg("slices"),
          py::arg("window"))
      .def(
          "is_next",
          [stepNamed](
              const LaunchOrder& order,
              const std::string& step,
              uint64_t op,
              int64_t index) {
            return order.isNext(stepNamed(step), op, index);
          },
          py::arg("step"),
          py::arg("op"),
          py::arg("index"))
      .def(
          "launched",
          [stepNamed](LaunchOrder& order, const std::string& step) {
            order.launched(stepNamed(step));
          },
          py::arg("step"))
      .def("issued_foreign", &LaunchOrder::issuedForeign)
      .def("foreign_next", &LaunchOrder::foreignNext)
      .def("launched_foreign", &LaunchOrder::launchedForeign)
      .def("drained", &LaunchOrder::drained);
  testing.def(
      "slice_numel_for",
      &fairring::sliceNumelFor,
      py::arg("slice_bytes"),
      py::arg("element_size"),
      py::arg("unit"));

  testing.def(
      "set_memory_order_enabled",
      &fairring::MemoryOrder::setEnabledForTests,
      py::arg("enabled"),
      "The negative control's switch: with False, collectives in flight on "
      "the same memory are no longer ordered (process-wide).");

  testing.def(
      "set_completed_by_wait_enabled",
      &fairring::DelegatedWorks::setCompletedByWaitForTests,
      py::arg("enabled"),
      "The negative control's switch: with False, a Gloo collective's Work "
      "that has no future (reduce_scatter_tensor's) is handed out as Gloo "
      "made it (process-wide).");

  testing.def(
      "set_launch_in_turn_enabled",
      &fairring::Backend::setLaunchInTurnForTests,
      py::arg("enabled"),
      "The negative control's switch: with False, a delegated all-reduce "
      "waits on its caller's thread for the engine's launches of the ops "
      "issued before it (process-wide).");

  testing.def(
      "set_block_follows_launches_enabled",
      &fairring::Backend::setBlockFollowsLaunchesForTests,
      py::arg("enabled"),
      "The negative control's switch: with False, a native coalescing "
      "block's first member does not wait for the launches in turn issued "
      "before it (process-wide).");

  testing.def(
      "set_delegate_aborted_on_failure",
      &fairring::Backend::setDelegateAbortedOnFailureForTests,
      py::arg("enabled"),
      "The negative control's switch: with False, a failure of the group "
      "leaves its CUDA delegate running (process-wide).");
  py::class_<GroupLog, std::shared_ptr<GroupLog>>(testing, "GroupLog")
      .def(
          "events",
          &GroupLog::snapshot,
          "What the recording groups were asked, in order.");
  testing.def(
      "record_cuda_delegate",
      [](fairring::Backend& backend) {
        auto log = std::make_shared<GroupLog>();
        backend.adoptCudaDelegateForTests(
            c10::make_intrusive<RecordingGroup>("cuda", "nccl", log));
        return log;
      },
      py::arg("backend"),
      "A stand-in for `backend`'s CUDA delegate (NCCL's group) that runs no "
      "collective and records how it is stopped; returns its GroupLog.");

  testing.def(
      "set_delegates_asked_for_work",
      &fairring::setDelegatesAskedForWorkForTests,
      py::arg("enabled"),
      "The negative control's switch: with False, a delegate gets the "
      "caller's asyncOp as it is, and may return no Work for a synchronous "
      "operation (process-wide).");

  // The model of CUDA graph capture on the emulated device (device/capture.h).
  testing.def(
      "begin_capture",
      &fairring::CaptureModel::begin,
      py::arg("seen") = true,
      "Begins the model's capture on this thread. seen=False: fairring's "
      "checks do not see it (the negative control).");
  testing.def(
      "end_capture", &fairring::CaptureModel::end, "Ends the model's capture.");
  testing.def(
      "capture_violations",
      &fairring::CaptureModel::takeViolations,
      "What was done that would invalidate a CUDA graph capture, since the "
      "last call (which clears the list).");
  // The emulated caller's stream (device/emulated.h, caller_stream).
  testing.def(
      "caller_stream_copy",
      [](at::Tensor destination, at::Tensor source) {
        fairring::enqueueOnEmulatedCallerStream(
            [destination, source]() mutable { destination.copy_(source); });
      },
      py::arg("destination"),
      py::arg("source"),
      "Copies `source` into `destination` on the emulated caller's stream, "
      "after what was queued there before.");
  testing.def(
      "caller_stream_synchronize",
      &fairring::synchronizeEmulatedCallerStream,
      py::arg("timeout") = std::chrono::milliseconds(60'000),
      py::call_guard<py::gil_scoped_release>(),
      "Whether the emulated caller's stream ran what was queued within "
      "`timeout`.");
  testing.def(
      "plan_unit",
      &fairring::planUnit,
      py::arg("local_size"),
      py::arg("machines"),
      py::arg("element_size"),
      py::arg("min_shard_bytes"),
      "The number of elements every (padded) slice is a multiple of.");
  testing.def(
      "plan",
      [](int64_t numel, int64_t sliceNumel, int64_t unit) {
        std::vector<std::tuple<int64_t, int64_t, int64_t>> slices;
        for (const auto& slice : fairring::makePlan(numel, sliceNumel, unit)) {
          slices.emplace_back(slice.offset, slice.numel, slice.paddedNumel);
        }
        return slices;
      },
      py::arg("numel"),
      py::arg("slice_numel"),
      py::arg("unit"),
      "The slice plan: [(offset, numel, padded_numel)].");

  // The shared-memory steps on their own: the engine calls them from C++.
  testing.def(
      "local_reduce_scatter",
      [](SharedMemorySteps& steps,
         at::Tensor slot,
         const at::Tensor& input,
         const std::string& opName,
         uint64_t seq,
         uint64_t slice,
         std::chrono::milliseconds timeout) {
        const auto op = localOpNamed(opName);
        at::Tensor unusedParts;
        steps.reduceScatter(
            slot,
            unusedParts,
            input,
            op,
            {seq, seq, slice, input.scalar_type(), op},
            std::chrono::steady_clock::now() + timeout);
      },
      py::arg("steps"),
      py::arg("slot"),
      py::arg("input"),
      py::arg("op"),
      py::arg("seq"),
      py::arg("slice"),
      py::arg("timeout"),
      py::call_guard<py::gil_scoped_release>());
  testing.def(
      "local_all_gather",
      [](SharedMemorySteps& steps,
         at::Tensor output,
         const at::Tensor& slot,
         uint64_t seq,
         uint64_t slice,
         std::chrono::milliseconds timeout) {
        steps.allGather(
            output,
            slot,
            {seq, seq, slice, slot.scalar_type(), c10d::ReduceOp::SUM},
            std::chrono::steady_clock::now() + timeout);
      },
      py::arg("steps"),
      py::arg("output"),
      py::arg("slot"),
      py::arg("seq"),
      py::arg("slice"),
      py::arg("timeout"),
      py::call_guard<py::gil_scoped_release>());

  rails::bindTensorpipe(testing);
}

} // namespace fairring::testing
