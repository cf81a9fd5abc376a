"""A group's FAIRRING_FLAT_THRESHOLD=auto: an earlier job's decision from the cache, checked, else the sweep.

Group rank 0 reads the cache and hands what it found to the others through
the group's store, so every rank takes the same decision even where only
rank 0's machine has the file. Every rank then checks it at the sizes around
its bounds (Sweep.verify), and the group measures again where it no longer
holds; a sweep's decision is the same on every rank by construction
(fairring/_dispatch.py), and rank 0 caches it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

import torch
import torch.distributed as dist

from . import _C, _dispatch_cache
from ._config import Config
from ._dispatch import COLLECTIVES, Decision, Exchange, Run, SizeTiming, Sweep
from ._errors import dist_error_like
from ._introspection import delegate_name

logger = logging.getLogger("fairring")

_MISS = "miss"


def measure_flat_threshold(
    device: torch.device,
    collective: str,
    run: Run,
    cpu_group: dist.Backend,
    store: dist.Store,
    topology: _C.Topology,
    config: Config,
    network: _C.RailsNetwork,
) -> Decision:
    """The threshold for `device`'s `collective`s in this group; collective over its ranks."""
    delegate = delegate_name(device)
    many = COLLECTIVES[collective]
    folder = config.auto_cache if topology.rank == 0 else None  # rank 0's cache decides
    key = _dispatch_cache.cache_key(config, topology, network, device, collective) if folder is not None else None
    cached = _cached(store, topology.rank, folder, key, f"{device.type}/{collective}")
    exchange = _exchange_over(cpu_group, topology)
    sweep = Sweep(run, exchange, device, topology.rank, topology.world_size, delegate, collective, topology.local_size)
    try:
        # A cached decision is checked before it is trusted: the network may have changed under its key.
        decision, found = (None, "") if cached is None else sweep.verify(cached)
        if decision is None:
            measured = sweep.measure(config.auto_budget_s)
            if folder is not None and key is not None and not measured.disagreed:
                _dispatch_cache.store(folder, key, measured)
            replaced = f"; replaced the cached decision, which no longer held: {found}" if cached is not None else ""
            decision = replace(measured, reason=measured.reason + replaced)
    except Exception as error:
        raise dist_error_like(
            error,
            f"fairring: rank {topology.rank}: measuring the engine against {delegate} for "
            f"FAIRRING_FLAT_THRESHOLD=auto failed, at the group's first {many[:-1]} the engine could take: {error}",
        ) from error
    if topology.rank == 0:
        logger.info("%s %s (FAIRRING_FLAT_THRESHOLD=auto): %s", device.type, many, decision.reason)
    return decision


def _cached(store: dist.Store, rank: int, folder: str | None, key: dict[str, Any] | None, what: str) -> Decision | None:
    """Rank 0's cached decision for `what` (device type and collective), on every rank."""
    shared = f"fairring/auto-threshold/{what}"
    if rank == 0:
        found = _dispatch_cache.load(folder, key) if folder is not None and key is not None else None
        store.set(shared, _MISS if found is None else json.dumps(asdict(found)))
        return found
    text = store.get(shared).decode()
    if text == _MISS:
        return None
    entry = json.loads(text)
    entry["sizes"] = [SizeTiming(**size) for size in entry["sizes"]]
    return Decision(**entry)


def _exchange_over(cpu_group: dist.Backend, topology: _C.Topology) -> Exchange:
    """Every rank's row, gathered into one table on every rank by a sum over the CPU group."""

    def exchange(row: Sequence[float]) -> torch.Tensor:
        table = torch.zeros(topology.world_size, len(row), dtype=torch.float64)
        table[topology.rank] = torch.tensor(row, dtype=torch.float64)
        cpu_group.allreduce([table]).wait()
        return table

    return exchange
