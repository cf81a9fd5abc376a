#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace fairring {

// The test suite's switches: faults and emulations a test asks for. They
// live under one private prefix, FAIRRING_TEST_, are read here and nowhere
// else (Python reads them through the bindings), and are not settings:
// docs/configuration.md leaves them out and fairring._known_variables does
// not check them.
enum class TestSwitch {
  // An emulated device in place of a CPU one (device/emulated.cpp).
  kEmulatedDevice,
  // A NIXL receiver that waits this many ms before each grant.
  kNixlSlowReceiverMs,
  // "1": NIXL writes go out without a grant, which the receiver must refuse.
  kNixlUngrantedWrites,
  // This rank corrupts its engine results, which auto's check must catch.
  kCorruptEngineResult,
  // "1": a TensorPipe rails listener admits a dialler whatever its proof
  // (rails/tensorpipe/handshake.h): the forger tests' negative control.
  kRailsProofUnchecked,
  // "1": each TensorPipe rails data message has one byte flipped on the
  // wire, as an attacker on the path would: encryption must catch it.
  kRailsTamper,
};

inline constexpr std::string_view kTestSwitchPrefix = "FAIRRING_TEST_";

// The variable's whole name, e.g. FAIRRING_TEST_EMULATED_DEVICE.
std::string testSwitchName(TestSwitch which);

// Its value, or nullopt where it is unset or empty.
std::optional<std::string> testSwitch(TestSwitch which);

// The same by its name without the prefix (the bindings'); a name not in
// TestSwitch is refused, so that a test cannot rely on a switch nobody reads.
std::optional<std::string> testSwitch(std::string_view suffix);

} // namespace fairring
