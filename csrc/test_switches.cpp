#include "test_switches.h"

#include <array>
#include <cstdlib>
#include <utility>

#include <c10/util/Exception.h>

namespace fairring {

namespace {

constexpr std::array<std::pair<TestSwitch, std::string_view>, 6> kSuffixes{{
    {TestSwitch::kEmulatedDevice, "EMULATED_DEVICE"},
    {TestSwitch::kNixlSlowReceiverMs, "NIXL_SLOW_RECEIVER_MS"},
    {TestSwitch::kNixlUngrantedWrites, "NIXL_UNGRANTED_WRITES"},
    {TestSwitch::kCorruptEngineResult, "CORRUPT_ENGINE_RESULT"},
    {TestSwitch::kRailsProofUnchecked, "RAILS_PROOF_UNCHECKED"},
    {TestSwitch::kRailsTamper, "RAILS_TAMPER"},
}};

} // namespace

std::string testSwitchName(TestSwitch which) {
  for (const auto& [candidate, suffix] : kSuffixes) {
    if (candidate == which) {
      return std::string(kTestSwitchPrefix) + std::string(suffix);
    }
  }
  TORCH_CHECK(
      false,
      "fairring: test switch ",
      static_cast<int>(which),
      " has no name; add it to kSuffixes in test_switches.cpp");
}

std::optional<std::string> testSwitch(TestSwitch which) {
  const char* value = std::getenv(testSwitchName(which).c_str());
  if (value == nullptr || *value == '\0') {
    return std::nullopt;
  }
  return std::string(value);
}

std::optional<std::string> testSwitch(std::string_view suffix) {
  for (const auto& [which, candidate] : kSuffixes) {
    if (candidate == suffix) {
      return testSwitch(which);
    }
  }
  TORCH_CHECK(
      false,
      "fairring: ",
      kTestSwitchPrefix,
      suffix,
      " is not a test switch; the switches are listed in test_switches.h");
}

} // namespace fairring
