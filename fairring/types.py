"""The dicts that fairring's accessors return, as TypedDicts.

`fairring/_C.pyi` types the extension's functions and `fairring.backend_of(...)`'s accessors with
these; a user's code may annotate with them too (`stats: EngineStats | None = backend.engine_stats()`).
They are runtime classes, so such annotations resolve at run time as well. The dicts themselves
are made in C++ (csrc/bindings/); tests/test_typed_api.py holds each class's keys to what a real
call returns. Every key is always present (total TypedDicts): an accessor that has nothing to say
returns None, not a dict with keys missing.
"""

from __future__ import annotations

from typing import Literal, TypedDict

# The collective kinds, as fairring::collectiveName() names them (csrc/engine/collective.h).
Collective = Literal["all_reduce", "reduce_scatter", "all_gather"]


class CollectiveCounts(TypedDict):
    """One kind's engine ops, and the bytes of their N-chunk tensors."""

    ops: int
    bytes: int


class ByCollective(TypedDict):
    """EngineStats' by_collective: every kind, counted or not."""

    all_reduce: CollectiveCounts
    reduce_scatter: CollectiveCounts
    all_gather: CollectiveCounts


class EngineStats(TypedDict):
    """Backend.engine_stats(device): the engine's counters."""

    ops: int
    slices: int
    flat_ops: int  # all-reduces the flat threshold sent to the delegate
    rail_bytes_sent: int
    rail_bytes_received: int
    local_steps: str  # the local steps' class, e.g. "shared memory"
    local_steps_state: Literal["running", "closed", "aborted"]
    by_collective: ByCollective


class StagingStats(TypedDict):
    """Backend.staging_stats(device): the engine's staging ring."""

    capacity_bytes: int
    bytes_in_use: int
    peak_bytes_in_use: int
    leases_in_use: int
    peak_leases_in_use: int
    leases_granted: int


class ThresholdSweepRow(TypedDict):
    """One size of FAIRRING_FLAT_THRESHOLD=auto's sweep: the seconds it took on each path."""

    bytes: int
    engine_s: float
    delegate_s: float


class MeasuredThreshold(TypedDict):
    """Backend.measured_threshold(device, collective): what FAIRRING_FLAT_THRESHOLD=auto decided."""

    threshold: int  # the engine from this size up
    ceiling: int  # the delegate again from this size up
    reason: str  # the sentence the INFO line says
    source: Literal["measured", "cache"]
    sizes: list[ThresholdSweepRow]


class UsageRow(TypedDict):
    """One row of Backend.usage(): one device type, collective and path that counted an op."""

    device: str  # the device type: "cpu" or "cuda"
    collective: Collective
    path: Literal["engine", "delegate"]
    ops: int
    bytes: int
    timed_ops: int
    timed_bytes: int
    busy_s: float
    # (smallest bytes of the power-of-two bucket, ops, bytes), for the buckets with ops only.
    by_size: list[tuple[int, int, int]]
    # Ops by why they took the path (csrc/backend/path_reason.h), for the reasons with ops only.
    by_reason: dict[str, int]


class PathChoice(TypedDict):
    """Backend.path_for(...): where a collective of that size would go now, and why."""

    path: Literal["engine", "delegate", "undecided"]
    # "engine", what keeps it off the engine (csrc/backend/path_reason.h), or "to_be_measured" while undecided.
    reason: str


class RailsInfo(TypedDict):
    """Backend.rails(device): the engine's rails."""

    transport: Literal["tensorpipe", "nixl"]
    interface: str  # the interface they listen on
    address: str  # its address
    spare_interfaces: list[str]  # where failover may move them (FAIRRING_RAIL_FAILOVER=1)
    # What the mesh registered (transports, channels), what its listener refused, the failover's state.
    description: str


class EngineFootprint(TypedDict):
    """Backend.engine_footprint(device): what the engine holds, and what making it added."""

    device: str  # e.g. "cpu", "cuda:0"
    staging_bytes: int
    pinned_host_bytes: int
    connections: int
    added_threads: int
    added_descriptors: int
    added_device_bytes: int  # -1: not measured (the CPU)
    summary: str  # the above, in a sentence


class ExtensionBuildInfo(TypedDict):
    """fairring._C.build_info(): what the extension was compiled with."""

    torch: str
    cuda_path: bool
    cuda: str | None  # None without the CUDA path
    tensorpipe: bool
    cxx_standard: int


class BuildInfo(ExtensionBuildInfo):
    """fairring.build_info(): the extension's, with fairring's version and torch's NCCL."""

    fairring: str
    nccl: str | None  # None without the CUDA path


class InterfaceAddress(TypedDict):
    """One entry of fairring._C.interface_addresses()."""

    name: str
    family: Literal["ipv4", "ipv6"]
    address: str
    up: bool
    loopback: bool
    link_local: bool


class PlanShape(TypedDict):
    """fairring._C.plan_shape(...): the engine's plan for an all-reduce (csrc/engine/plan.h)."""

    unit: int
    slice_numel: int
    slices: int
    shard_bytes: int
    staging_bytes: int
    slices_in_flight: int
    below_floor: bool
    staging_capacity: int
