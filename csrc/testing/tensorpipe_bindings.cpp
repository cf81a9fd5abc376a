#include <torch_headers.h> // first: the precompiled torch headers

// The TensorPipe rails' Python bindings, for tests and benchmarks: the hello
// check, the rails endpoint and the wire probe. Built only with TensorPipe
// (rails/tensorpipe/none.cpp binds nothing in their place).

#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <torch/extension.h>

#include "testing/endpoint.h"
#include "rails/tensorpipe/factory.h"
#include "rails/tensorpipe/acceptor.h"
#include "rails/tensorpipe/mesh.h"
#include "testing/wire_probe.h"

namespace py = pybind11;

namespace fairring::rails {

namespace {

Lane laneOf(int lane) {
  TORCH_CHECK(
      lane >= 0 && lane < kLanes,
      "fairring: lane must be 0 (shards) or 1 (reduced), not ",
      lane);
  return static_cast<Lane>(lane);
}

// Endpoint::send or Endpoint::expect, taking the lane as Python's int.
template <typename Method>
auto transferMethod(Method method) {
  return [method](
             Endpoint& endpoint,
             int machine,
             int lane,
             std::string tag,
             const at::Tensor& tensor) {
    return (endpoint.*method)(machine, laneOf(lane), std::move(tag), tensor);
  };
}

// Python drops its last reference to an endpoint with the GIL held, and the
// destructor joins TensorPipe, whose callbacks may drop the last reference
// to a tensor Python made, which takes the GIL: it runs without it (as the
// product's Backend does, csrc/bindings.cpp).
struct DestroyWithoutGil {
  void operator()(Endpoint* endpoint) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release noGil;
      std::default_delete<Endpoint>()(endpoint);
    } else {
      std::default_delete<Endpoint>()(endpoint);
    }
  }
};
using EndpointHolder = std::unique_ptr<Endpoint, DestroyWithoutGil>;

} // namespace

void bindTensorpipe(py::module_& module) {
  module.def(
      "check_hello",
      [](const std::string& hello,
         const fairring::Topology& topology,
         bool cuda) {
        int rank = -1;
        int lane = -1;
        int deviceIndex = -1;
        std::string why =
            checkHello(hello, topology, cuda, rank, lane, deviceIndex);
        return std::make_tuple(why, rank, lane, deviceIndex);
      },
      py::arg("hello"),
      py::arg("topology"),
      py::arg("cuda") = false,
      "A rails hello as the accepting rank (topology.rank) checks it: "
      "(why it is refused, or '', rank, lane, device index).");
  py::class_<Transfer, std::shared_ptr<Transfer>>(module, "Transfer")
      .def(
          "wait",
          [](Transfer& transfer, double timeoutSeconds) {
            transfer.wait(
                std::chrono::milliseconds(
                    static_cast<int64_t>(timeoutSeconds * 1000)));
          },
          py::arg("timeout") = 60.0,
          py::call_guard<py::gil_scoped_release>(),
          "Blocks until the transfer is done; raises its failure, or on "
          "timeout (seconds).");
  py::class_<Endpoint, EndpointHolder>(module, "RailsEndpoint")
      .def(
          py::init([](c10::intrusive_ptr<c10d::Store> store,
                      const std::string& prefix,
                      int rank,
                      std::vector<std::vector<int>> machines,
                      c10::Device device,
                      const fairring::RailsNetwork& network,
                      std::chrono::milliseconds timeout) {
            return EndpointHolder(
                std::make_unique<Endpoint>(
                    store,
                    prefix,
                    fairring::Topology(rank, std::move(machines)),
                    device,
                    network,
                    timeout)
                    .release());
          }),
          py::arg("store"),
          py::arg("prefix"),
          py::arg("rank"),
          py::arg("machines"),
          py::arg("device"),
          py::arg("network") = fairring::RailsNetwork{},
          py::arg("timeout") = std::chrono::milliseconds(60000),
          py::call_guard<py::gil_scoped_release>(),
          "The rails protocol between this rank and its rail peers, over "
          "TensorPipe (collective over them): for tests and benchmarks.")
      .def(
          "send",
          transferMethod(&Endpoint::send),
          py::arg("machine"),
          py::arg("lane"),
          py::arg("tag"),
          py::arg("tensor"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "expect",
          transferMethod(&Endpoint::expect),
          py::arg("machine"),
          py::arg("lane"),
          py::arg("tag"),
          py::arg("tensor"),
          py::call_guard<py::gil_scoped_release>())
      .def("close", &Endpoint::close, py::call_guard<py::gil_scoped_release>())
      .def(
          "switch_rail",
          &Endpoint::switchRail,
          py::arg("machine"),
          py::arg("generation"),
          py::arg("timeout") = std::chrono::milliseconds(30000),
          py::call_guard<py::gil_scoped_release>(),
          "A rail switch with the peer on `machine`, both ends calling it.")
      .def("describe", &Endpoint::describe);

  py::class_<WireProbe>(module, "WireProbe")
      .def(
          py::init<>(),
          "For tests: a bare TensorPipe client that throws scripted messages "
          "at a rank's rails listener.")
      .def(
          "exchange",
          [](WireProbe& probe,
             const std::string& url,
             const std::vector<std::tuple<
                 std::string,
                 std::vector<size_t>,
                 std::vector<size_t>,
                 bool>>& specs,
             bool readReply,
             double timeoutSeconds) {
            std::vector<WireProbe::Message> messages;
            for (const auto& [metadata, payloads, tensors, targetCpu] : specs) {
              messages.push_back({metadata, payloads, tensors, targetCpu});
            }
            WireProbe::Outcome outcome;
            {
              py::gil_scoped_release noGil;
              outcome = probe.exchange(
                  url,
                  messages,
                  readReply,
                  std::chrono::milliseconds(
                      static_cast<int64_t>(timeoutSeconds * 1000)));
            }
            py::dict result;
            result["written"] = outcome.written;
            result["write_error"] = outcome.writeError;
            result["reply"] = outcome.reply
                ? py::object(py::bytes(*outcome.reply))
                : py::object(py::none());
            result["read_error"] = outcome.readError;
            result["timed_out"] = outcome.timedOut;
            result["seconds"] = outcome.seconds;
            return result;
          },
          py::arg("url"),
          py::arg("messages"),
          py::arg("read_reply") = true,
          py::arg("timeout") = 2.0,
          "Opens a pipe to `url` (uv://host:port), writes `messages`, each "
          "(metadata: bytes, payload lengths, tensor lengths, whether tensors "
          "name the CPU as target), then, if read_reply, waits for a message "
          "back; each step waits at most `timeout` seconds, then the pipe is "
          "closed. Returns {written, write_error, reply (metadata or None), "
          "read_error, timed_out ('', 'write' or 'read'), seconds}.")
      .def(
          "handshake",
          [](WireProbe& probe,
             const std::string& url,
             const std::string& hello,
             const std::function<py::bytes(py::bytes)>& answer,
             double timeoutSeconds) {
            WireProbe::Handshake result;
            {
              py::gil_scoped_release noGil;
              result = probe.handshake(
                  url,
                  hello,
                  [&answer](const std::string& challenge) {
                    py::gil_scoped_acquire gil;
                    return std::string(answer(py::bytes(challenge)));
                  },
                  std::chrono::milliseconds(
                      static_cast<int64_t>(timeoutSeconds * 1000)));
            }
            const auto& outcome = result.outcome;
            py::dict out;
            out["challenge"] = result.challenge
                ? py::object(py::bytes(*result.challenge))
                : py::object(py::none());
            out["written"] = outcome.written;
            out["write_error"] = outcome.writeError;
            out["reply"] = outcome.reply ? py::object(py::bytes(*outcome.reply))
                                         : py::object(py::none());
            out["read_error"] = outcome.readError;
            out["timed_out"] = outcome.timedOut;
            return out;
          },
          py::arg("url"),
          py::arg("hello"),
          py::arg("answer"),
          py::arg("timeout") = 5.0,
          "A forger's handshake: writes `hello` to `url`, reads the "
          "listener's challenge, writes answer(challenge), reads the reply. "
          "Returns {challenge, written, write_error, reply, read_error, "
          "timed_out}.");
}

} // namespace fairring::rails
