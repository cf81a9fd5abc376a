#pragma once

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "device/device.h"

namespace fairring {

// Makes the inner process groups a Backend needs, through torch's own public
// constructors (fairring/_registration.py implements it in Python: the torch
// wheel ships no Gloo headers, and NCCL groups made there need no NCCL
// headers here). Every call is collective over the ranks it names, and the
// Backend calls it at points every rank reaches in the same order.
class InnerGroupFactory {
 public:
  virtual ~InnerGroupFactory() = default;

  // The group over every rank that serves tensors of `type` (NCCL for CUDA).
  virtual c10::intrusive_ptr<c10d::Backend> delegate(c10::DeviceType type) = 0;
  // The local-step groups of the engine on `device`, made and connected, one
  // after the other, in the same order on every rank of the machine; null
  // with one rank per machine.
  virtual LocalGroups localGroups(c10::Device device) = 0;
};

} // namespace fairring
