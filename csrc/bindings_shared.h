#pragma once

#include <torch/extension.h>

#include "engine/staging.h"

namespace fairring {

// What the product's bindings (bindings.cpp) share with the test-only ones
// (testing/bindings.cpp): the staging allocator's statistics as a dict.
pybind11::dict stagingDict(const StagingStats& stats);

} // namespace fairring
