#pragma once

#include <torch/extension.h>

namespace fairring::testing {

// Binds the test-only objects and functions into `testing`, the product
// module's _testing submodule (one extension: the sources compile once).
void bindTesting(pybind11::module_& testing);

// The rails' part of it: the peers' formats, the fake NIXL pair
// (rails_bindings.cpp).
void bindRailsTesting(pybind11::module_& testing);

} // namespace fairring::testing
