#include <torch_headers.h> // first: the precompiled torch headers

// The tests' bindings of the rails: every format a rank accepts from peers
// (the control notes, the NIXL and TensorPipe wires), parsed and written
// without a network, and two NIXL meshes over the fake NIXL.

#include "testing/bindings.h"

#include <string>

#include <torch/extension.h>

#include "rails/auth/sealed.h"
#include "rails/lanes.h"
#include "rails/nixl/wire.h"
#include "rails/tensorpipe/wire.h"
#include "rails/watch.h"
#include "testing/fake_nixl_pair.h"

namespace py = pybind11;

namespace fairring::testing {

void bindRailsTesting(py::module_& testing) {
  // The store values' seal (rails/auth/sealed.h), for tests that forge one.
  testing.def(
      "seal_for_store",
      [](const py::bytes& key,
         const std::string& storeKey,
         const py::bytes& value) {
        return py::bytes(
            fairring::rails::auth::sealForStore(
                std::string(key), storeKey, std::string(value)));
      },
      py::arg("key"),
      py::arg("store_key"),
      py::arg("value"));
  testing.def(
      "open_from_store",
      [](const py::bytes& key,
         const std::string& storeKey,
         const py::bytes& sealed) -> py::object {
        const auto value = fairring::rails::auth::openFromStore(
            std::string(key), storeKey, std::string(sealed));
        return value ? py::object(py::bytes(*value)) : py::object(py::none());
      },
      py::arg("key"),
      py::arg("store_key"),
      py::arg("sealed"),
      "The value sealed for store_key with key, or None.");
  // What a rank accepts from peers, exposed so tests can throw malformed
  // input at the checks without a network.
  testing.def(
      "parse_notice",
      [](const std::string& text, int worldSize) -> py::object {
        fairring::rails::Watch::Notice notice;
        if (!fairring::rails::Watch::parseNotice(text, worldSize, notice)) {
          return py::none();
        }
        return py::make_tuple(notice.culprit, notice.what);
      },
      py::arg("text"),
      py::arg("world_size"),
      "A control note parsed as a failure notice: (culprit, what), or None.");
  // The NIXL rails' formats (rails/nixl/wire.h), parsed and written without
  // NIXL: a parsed value is a dict, a refusal the reason's string.
  namespace wire = fairring::rails::nixl;
  testing.def(
      "nixl_parse_message",
      [](const py::bytes& bytes, int lanes, size_t maxNoteBytes) -> py::object {
        std::string error;
        const auto message =
            wire::parse(std::string(bytes), lanes, maxNoteBytes, error);
        if (!message) {
          return py::str(error);
        }
        py::dict out;
        out["kind"] = std::string(1, static_cast<char>(message->kind));
        out["lane"] = message->lane;
        out["seq"] = message->seq;
        out["address"] = message->address;
        out["bytes"] = message->bytes;
        out["text"] = py::bytes(message->text);
        return out;
      },
      py::arg("bytes"),
      py::arg("lanes"),
      py::arg("max_note_bytes"));
  testing.def(
      "nixl_encode_message",
      [](const std::string& kind,
         int lane,
         uint64_t seq,
         uint64_t address,
         uint64_t bytes,
         const py::bytes& text) {
        wire::Message message;
        message.kind = static_cast<wire::Kind>(kind.at(0));
        message.lane = lane;
        message.seq = seq;
        message.address = address;
        message.bytes = bytes;
        message.text = std::string(text);
        return py::bytes(wire::encode(message));
      },
      py::arg("kind"),
      py::arg("lane"),
      py::arg("seq"),
      py::arg("address"),
      py::arg("bytes"),
      py::arg("text"));
  testing.def(
      "nixl_parse_staging_record",
      [](const py::bytes& bytes) -> py::object {
        std::string error;
        const auto record = wire::parseStagingRecord(std::string(bytes), error);
        if (!record) {
          return py::str(error);
        }
        py::dict out;
        out["rank"] = record->rank;
        out["agent"] = py::bytes(record->agent);
        out["memory_type"] = record->memoryType;
        out["device_id"] = record->deviceId;
        out["address"] = record->address;
        out["bytes"] = record->bytes;
        out["agent_metadata"] = py::bytes(record->agentMetadata);
        return out;
      },
      py::arg("bytes"));
  testing.def(
      "nixl_encode_staging_record",
      [](uint64_t rank,
         const py::bytes& agent,
         uint64_t memoryType,
         uint64_t deviceId,
         uint64_t address,
         uint64_t bytes,
         const py::bytes& agentMetadata) {
        return py::bytes(
            wire::encode(
                wire::StagingRecord{
                    rank,
                    agent,
                    memoryType,
                    deviceId,
                    address,
                    bytes,
                    std::string(agentMetadata)}));
      },
      py::arg("rank"),
      py::arg("agent"),
      py::arg("memory_type"),
      py::arg("device_id"),
      py::arg("address"),
      py::arg("bytes"),
      py::arg("agent_metadata"));
  // The TensorPipe rails' texts (rails/tensorpipe/wire.h), likewise.
  testing.def(
      "tensorpipe_parse_hello",
      [](const py::bytes& bytes) -> py::object {
        std::string error;
        const auto hello =
            fairring::rails::parseHello(std::string(bytes), error);
        if (!hello) {
          return py::str(error);
        }
        py::dict out;
        out["rank"] = hello->rank;
        out["lane"] = hello->lane;
        out["device_index"] = hello->deviceIndex;
        if (hello->generation > 0) {
          out["generation"] = hello->generation;
          out["received"] =
              py::make_tuple(hello->received.shards, hello->received.reduced);
        }
        return out;
      },
      py::arg("bytes"));
  testing.def(
      "tensorpipe_encode_hello",
      [](int rank,
         int lane,
         int deviceIndex,
         uint64_t generation,
         uint64_t shards,
         uint64_t reduced) {
        return py::bytes(
            fairring::rails::encode(
                fairring::rails::Hello{
                    rank, lane, deviceIndex, generation, {shards, reduced}}));
      },
      py::arg("rank"),
      py::arg("lane"),
      py::arg("device_index"),
      py::arg("generation") = 0,
      py::arg("received_shards") = 0,
      py::arg("received_reduced") = 0);
  testing.def(
      "tensorpipe_parse_switch_record",
      [](const py::bytes& bytes) -> py::object {
        std::string error;
        const auto record =
            fairring::rails::parseSwitchRecord(std::string(bytes), error);
        if (!record) {
          return py::str(error);
        }
        py::dict out;
        out["device_index"] = record->deviceIndex;
        out["received"] =
            py::make_tuple(record->received.shards, record->received.reduced);
        out["url"] = py::bytes(record->url);
        return out;
      },
      py::arg("bytes"));
  testing.def(
      "tensorpipe_encode_switch_record",
      [](int deviceIndex,
         uint64_t shards,
         uint64_t reduced,
         const py::bytes& url) {
        return py::bytes(
            fairring::rails::encode(
                fairring::rails::SwitchRecord{
                    deviceIndex, {shards, reduced}, std::string(url)}));
      },
      py::arg("device_index"),
      py::arg("received_shards"),
      py::arg("received_reduced"),
      py::arg("url"));
  testing.def(
      "parse_acked_note",
      [](const std::string& text) -> py::object {
        const auto counts = fairring::rails::parseAckedNote(text);
        if (!counts) {
          return py::none();
        }
        return py::make_tuple(counts->shards, counts->reduced);
      },
      py::arg("text"));
  testing.def(
      "tensorpipe_parse_address_record",
      [](const py::bytes& bytes) -> py::object {
        std::string error;
        const auto record =
            fairring::rails::parseAddressRecord(std::string(bytes), error);
        if (!record) {
          return py::str(error);
        }
        py::dict out;
        out["device_index"] = record->deviceIndex;
        out["url"] = py::bytes(record->url);
        return out;
      },
      py::arg("bytes"));
  testing.def(
      "tensorpipe_encode_address_record",
      [](int deviceIndex, const py::bytes& url) {
        return py::bytes(
            fairring::rails::encode(
                fairring::rails::AddressRecord{deviceIndex, std::string(url)}));
      },
      py::arg("device_index"),
      py::arg("url"));
  // Two NIXL meshes over the fake NIXL (testing/fake_nixl_pair.h); an op's
  // outcome is a dict, or None while it has not finished.
  using fairring::testing::FakeNixlPair;
  py::class_<FakeNixlPair>(testing, "FakeNixlPair")
      .def(
          py::init<size_t, int, bool>(),
          py::arg("staging_bytes"),
          py::arg("slow_receiver_ms") = 0,
          py::arg("ungranted_writes") = false,
          py::call_guard<py::gil_scoped_release>())
      .def("agent", &FakeNixlPair::agent, py::arg("rank"))
      .def("staging_address", &FakeNixlPair::stagingAddress, py::arg("rank"))
      .def(
          "send",
          &FakeNixlPair::send,
          py::arg("rank"),
          py::arg("tag"),
          py::arg("offset"),
          py::arg("bytes"),
          py::arg("fill"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "receive",
          &FakeNixlPair::receive,
          py::arg("rank"),
          py::arg("tag"),
          py::arg("offset"),
          py::arg("bytes"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "send_note",
          &FakeNixlPair::sendNote,
          py::arg("rank"),
          py::arg("text"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "read_note",
          &FakeNixlPair::readNote,
          py::arg("rank"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "wait",
          [](FakeNixlPair& pair, int id, double seconds) -> py::object {
            FakeNixlPair::Outcome outcome;
            {
              py::gil_scoped_release released;
              outcome = pair.wait(id, seconds);
            }
            if (!outcome.finished) {
              return py::none();
            }
            py::dict out;
            out["error"] = outcome.error;
            out["tag"] = py::bytes(outcome.tag);
            out["bytes"] = outcome.bytes;
            out["data"] = py::bytes(outcome.data);
            return out;
          },
          py::arg("id"),
          py::arg("seconds"))
      .def(
          "inject",
          [](FakeNixlPair& pair,
             const std::string& from,
             int rank,
             const py::bytes& bytes) {
            return pair.inject(from, rank, std::string(bytes));
          },
          py::arg("sender"),
          py::arg("rank"),
          py::arg("bytes"))
      .def("describe", &FakeNixlPair::describe, py::arg("rank"))
      .def(
          "shutdown",
          &FakeNixlPair::shutdown,
          py::call_guard<py::gil_scoped_release>());
}

} // namespace fairring::testing
