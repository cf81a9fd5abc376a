// The torch headers that most translation units read, precompiled once per
// build (setup.py, BuildExtensionWithPch): the translation units that use
// c10d include this first, as <torch_headers.h>, so that the compiler finds
// the build's precompiled copy ahead of this file, and compile in about half
// the time. Where no precompiled copy was made, this is an ordinary header.
// No include guard: each translation unit includes it once, first, and a
// guard in a precompiled header's main file draws a warning.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
