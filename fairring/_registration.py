"""Creates fairring backends for torch.distributed and registers the name."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from . import _C
from .config import SLICE_SIZE, TOTAL_MEMORY, Config, ConfigError, apply_log_level, format_size, load_config
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
    check_staging_fits(config, topology)

    # The CPU group: Gloo, in its own key space of the group's store.
    cpu_backend = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
    local_reduce_scatter, local_all_gather = _local_groups(store, topology, timeout)
    backend = _C.Backend(
        store,
        topology,
        _C.Config(
            total_memory_bytes=config.total_memory,
            slice_size_bytes=config.slice_size,
            flat_threshold_bytes=config.flat_threshold,
            socket_interface=config.socket_interface or "",
            cuda_engine=config.cuda_engine,
            infiniband_disabled=config.ib_disable,
        ),
        timeout,
        cpu_backend,
        local_reduce_scatter,
        local_all_gather,
    )
    if backend.rails() is not None:
        logger.debug("group %s: rank %d rails listen on %s", dist_options.group_id, rank, backend.rails())
    return backend


def check_staging_fits(config: Config, topology: _C.Topology) -> None:
    """The staging pool must hold at least one slice; say which variable to change if not."""
    if topology.num_machines == 1:
        return  # no engine, no staging
    needed = _C.staging_bytes_for(config.slice_size, topology.local_size, topology.num_machines)
    if config.total_memory < needed:
        raise ConfigError(
            f"{TOTAL_MEMORY}={format_size(config.total_memory)} cannot hold one slice in flight: with "
            f"{SLICE_SIZE}={format_size(config.slice_size)} and {topology.local_size} rank(s) per machine a "
            f"slice needs {format_size(needed)} of staging. Raise {TOTAL_MEMORY} to at least {needed} bytes "
            f"or lower {SLICE_SIZE}."
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
