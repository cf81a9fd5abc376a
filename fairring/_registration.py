"""Creates fairring backends for torch.distributed and registers the name."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from . import _C
from .config import apply_log_level, load_config
from .topology import exchange_identities, group_into_machines, identify_self

logger = logging.getLogger("fairring")

BACKEND_NAME = "fairring"
_logged_config = False


def _create_backend(dist_options: Any, backend_options: Any) -> _C.Backend:
    """torch's extended-API creator: one backend per process group."""
    global _logged_config
    config = load_config()
    apply_log_level(config)
    if not _logged_config:
        logger.debug("effective configuration: %s", config.describe())
        _logged_config = True

    store = dist_options.store
    rank, size, timeout = dist_options.group_rank, dist_options.group_size, dist_options.timeout
    identities = exchange_identities(store, rank, size, identify_self(config), config, timeout)
    topology = _C.Topology(rank, group_into_machines(identities))
    logger.debug("group %s: %s", dist_options.group_id, topology)

    # The CPU group: Gloo, in its own key space of the group's store.
    cpu_backend = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
    local_reduce_scatter, local_all_gather = _local_groups(store, topology, timeout)
    return _C.Backend(
        store,
        topology,
        _C.Config(
            total_memory_bytes=config.total_memory,
            slice_size_bytes=config.slice_size,
            socket_interface=config.socket_interface or "",
        ),
        timeout,
        cpu_backend,
        local_reduce_scatter,
        local_all_gather,
    )


def _local_groups(
    store: dist.Store, topology: _C.Topology, timeout: timedelta
) -> tuple[dist.ProcessGroupGloo | None, dist.ProcessGroupGloo | None]:
    """The engine's groups over this machine's ranks: one per local step.

    Each step is fed by its own engine thread, so each needs its own group:
    two threads sharing one could interleave their operations differently on
    different ranks. None where there is nothing to do locally.
    """
    if topology.num_machines == 1 or topology.local_size == 1:
        return None, None
    groups = []
    for step in ("reduce-scatter", "all-gather"):
        prefix = f"fairring/machine{topology.machine}/{step}/"
        groups.append(
            dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), topology.local_rank, topology.local_size, timeout)
        )
    return groups[0], groups[1]


def register() -> None:
    """Makes "fairring" a torch.distributed backend name, for CPU and CUDA."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"])
