"""The engine's plan for each size class of all-reduce, for the log (FAIRRING_LOG_LEVEL=DEBUG).

The plan is the C++ engine's own (csrc/engine/plan.h, through _C.plan_shape),
computed without running anything: which path an all-reduce of each size takes,
how it is sliced, how long its shards are and how many slices the staging
memory holds at once.
"""

from __future__ import annotations

from . import _C
from ._config import FLAT_THRESHOLD, MIN_SHARD_SIZE, TOTAL_MEMORY, Config
from ._sizes import format_bytes, format_size

KiB = 1024
# Sizes of float32 all-reduces the log describes: 1 KiB to 1 GiB, by factors of 4.
SIZE_CLASSES = tuple(KiB << (2 * step) for step in range(11))
ELEMENT_SIZE = 4


def plan_of(tensor_bytes: int, config: Config, topology: _C.Topology, device_type: str) -> dict:
    """_C.plan_shape for a float32 all-reduce of `tensor_bytes` on this group."""
    return _C.plan_shape(
        numel=tensor_bytes // ELEMENT_SIZE,
        element_size=ELEMENT_SIZE,
        local_size=topology.local_size,
        machines=topology.num_machines,
        transport_min_shard_bytes=_C.CUDA_MIN_SHARD_BYTES if device_type == "cuda" else 1,
        max_slice_bytes=config.slice_size,
        min_shard_bytes=config.min_shard,
        total_memory_bytes=config.total_memory,
        max_slices_in_flight=config.slices_in_flight,
    )


def describe_plans(config: Config, topology: _C.Topology, device_type: str) -> list[str]:
    """A line per size class: the delegate, or the Herring plan."""
    threshold = config.cuda_flat_threshold if device_type == "cuda" else config.cpu_flat_threshold
    lines = []
    for size in SIZE_CLASSES:
        if size < threshold:
            lines.append(f"{format_size(size):>7}: the delegate (below {FLAT_THRESHOLD}={format_size(threshold)})")
            continue
        plan = plan_of(size, config, topology, device_type)
        slices = plan["slices"]
        note = f", below {MIN_SHARD_SIZE}: the staging memory holds no longer slices" if plan["below_floor"] else ""
        lines.append(
            f"{format_size(size):>7}: {slices} slice{'s' if slices > 1 else ''} of "
            f"{format_bytes(min(size, plan['slice_numel'] * ELEMENT_SIZE))}, "
            f"shards of {format_bytes(plan['shard_bytes'])}, "
            f"{plan['slices_in_flight']} in flight{note}"
        )
    return lines


def floor_advice(config: Config, topology: _C.Topology, device_type: str) -> str | None:
    """What to set when large all-reduces get shards below the floor, else None."""
    largest = plan_of(SIZE_CLASSES[-1], config, topology, device_type)
    if not largest["below_floor"]:
        return None
    ranks = topology.local_size * topology.num_machines
    floor_slice = ranks * config.min_shard
    # The plan gives a slice's unpadded staging at most half the memory (two slices in flight).
    staging = _C.staging_bytes_for(floor_slice, topology.local_size, topology.num_machines, padded=False)
    needed_mib = -(-2 * staging // (1 << 20))
    return (
        f"with {topology.num_machines} machines x {topology.local_size} ranks, large all-reduces are cut into "
        f"shards of {format_bytes(largest['shard_bytes'])}, below {MIN_SHARD_SIZE}={format_size(config.min_shard)}: "
        f"{TOTAL_MEMORY}={format_size(config.total_memory)} holds two slices of at most "
        f"{format_bytes(largest['slice_numel'] * ELEMENT_SIZE)}. Set {TOTAL_MEMORY} to at least {needed_mib}MiB "
        f"for {format_size(config.min_shard)} shards, or lower {MIN_SHARD_SIZE}."
    )
