"""Reaching a group's fairring backend, for its accessors."""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import _C

# TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every backend in this (where Gloo is built).
_WRAPPER = getattr(torch._C._distributed_c10d, "_ProcessGroupWrapper", None)


def delegate_name(device: str | torch.device) -> str:
    """What fairring hands `device`'s tensors to where its engine does not take them: NCCL (CUDA), else Gloo."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def backend_of(group: dist.ProcessGroup | None = None, device: str | torch.device = "cpu") -> _C.Backend:
    """The fairring backend that serves `device` tensors in `group` (default: the world group).

    Its accessors say what the group does: `topology`, `rails(device)`,
    `engine_stats(device)`, `staging_stats(device)`, `config`, `timeout`.
    Sees through the wrapper that TORCH_DISTRIBUTED_DEBUG=DETAIL adds.
    """
    group = dist.group.WORLD if group is None else group
    if group is None:
        raise RuntimeError("fairring.backend_of: no process group; call torch.distributed.init_process_group first")
    backend = group._get_backend(torch.device(device))
    while _WRAPPER is not None and isinstance(backend, _WRAPPER):
        backend = backend.wrapped_pg
    reconfigurable = getattr(_C, "ReconfigurableBackend", None)
    if reconfigurable is not None and isinstance(backend, reconfigurable):
        backend = backend.current  # the current members' (enable_reconfigure=True)
    if not isinstance(backend, _C.Backend):
        raise ValueError(
            f"fairring.backend_of: the group serves {torch.device(device).type} tensors with "
            f"{type(backend).__name__}, not fairring"
        )
    return backend
