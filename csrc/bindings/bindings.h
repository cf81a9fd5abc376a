#pragma once

#include <torch/extension.h>

#include "engine/staging.h"

// The product's Python bindings, one function per area, each in its own file
// of this folder; bindings/module.cpp calls them in this order, which is the
// order their types must be registered in (a default argument of a bound type
// needs that type registered first).
namespace fairring::bindings {

// Topology, RailsNetwork, Config, the host's interfaces (settings.cpp).
void bindSettings(pybind11::module_& module);

// The shared-memory local steps, the engine's plan and staging sizes
// (engine_parts.cpp).
void bindEngineParts(pybind11::module_& module);

// Backend, ReconfigurableBackend, the pending and failure reports
// (backend.cpp).
void bindBackend(pybind11::module_& module);

// The staging allocator's statistics as a dict; the tests' bindings use it
// too (engine_parts.cpp).
pybind11::dict stagingDict(const StagingStats& stats);

} // namespace fairring::bindings
