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


def register_shrunk_groups_as_fairring() -> None:
    original = getattr(c10d, "_create_shrunk_process_group", None)
    if original is None or getattr(original, _INSTALLED, False):
        return  # a torch without shrink_group, or installed already

    @functools.wraps(original)
    def _create_shrunk_process_group(new_backend: Any, *args: Any, **kwargs: Any) -> dist.ProcessGroup:
        group = original(new_backend, *args, **kwargs)
        if isinstance(new_backend, _C.Backend):
            custom = dist.ProcessGroup.BackendType.CUSTOM
            for device in ("cpu", "cuda"):  # as register() registers fairring
                group._register_backend(torch.device(device), custom, new_backend)
            group._set_default_backend(custom)
        return group

    setattr(_create_shrunk_process_group, _INSTALLED, True)
    c10d._create_shrunk_process_group = _create_shrunk_process_group
