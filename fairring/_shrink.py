"""Groups that shrink_group makes from fairring groups are registered as fairring groups.

torch's shrink_group registers the shrunk backend under a type it picks from
the group's bound device: GLOO for CPU, NCCL for CUDA, and for that device
only. A fairring backend registered as GLOO is taken for a ProcessGroupGloo by
code that casts on that type (DDP's logger does, and crashes), and the group
would no longer serve the other device's tensors. This registers it as the
custom backend it is, for CPU and CUDA as the group it came from, and leaves
the groups of every other backend alone.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import _C

_INSTALLED = "_fairring_registers_shrunk_groups"


def serve_cpu_and_cuda(group: dist.ProcessGroup, backend: dist.Backend) -> None:
    """`backend` serves `group`'s CPU and CUDA tensors as the custom backend it is, as register() registers fairring."""
    custom = dist.ProcessGroup.BackendType.CUSTOM
    for device in ("cpu", "cuda"):
        group._register_backend(torch.device(device), custom, backend)
    group._set_default_backend(custom)


def register_shrunk_groups_as_fairring() -> None:
    original = getattr(c10d, "_create_shrunk_process_group", None)
    if original is None or getattr(original, _INSTALLED, False):
        return  # a torch without shrink_group, or installed already

    @functools.wraps(original)
    def _create_shrunk_process_group(new_backend: Any, *args: Any, **kwargs: Any) -> dist.ProcessGroup:
        group = original(new_backend, *args, **kwargs)
        if isinstance(new_backend, _C.Backend):
            serve_cpu_and_cuda(group, new_backend)
        return group

    setattr(_create_shrunk_process_group, _INSTALLED, True)
    c10d._create_shrunk_process_group = _create_shrunk_process_group
