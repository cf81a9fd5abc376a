"""What fairring did for a group: `fairring.summary(group)`, and the line said at destroy_process_group.

Per device type, collective kind and path (the engine or the delegate, Gloo
or NCCL): how many ops and bytes, how long at least one was in flight
(csrc/backend/usage.h: the host clock for CPU tensors, device events for
CUDA ones), the bandwidth that makes, its fraction of the bound (what each
machine must send, over its rails' NICs), and, where FAIRRING_FLAT_THRESHOLD=auto
measured both paths, the time this path saved (or lost, negative) against the
other, estimated from that sweep at the sizes the ops had.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from . import _C
from ._config import Config, load_config
from ._interfaces import choose_rail_interface, host_addresses, nic_speed_mbps
from ._introspection import backend_of, delegate_name
from ._sizes import format_bytes
from .bench.collectives import COLLECTIVES

logger = logging.getLogger("fairring")


@dataclass(frozen=True)
class PathUsage:
    """One device type, collective kind and path."""

    device: str  # "cpu" or "cuda"
    collective: str  # "all_reduce", "reduce_scatter" or "all_gather"
    path: str  # "engine", or the delegate: "gloo" or "nccl"
    ops: int
    bytes: int  # of the N-chunk tensors: an all-reduce's, a reduce-scatter's input, an all-gather's output
    timed_ops: int  # those in busy_s: not captured, coalesced, failed or still in flight
    busy_s: float  # seconds with at least one of the timed ops in flight
    bytes_per_s: float | None  # the timed ops' bytes over busy_s
    of_bound: float | None  # the bound's time for the timed ops' bytes over busy_s
    saved_s: float | None  # against the other path, by auto's sweep; negative: lost
    # Ops by why they took the path: "engine", or what kept them off it (csrc/backend/path_reason.h).
    by_reason: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        text = f"{self.path} {self.ops} ops {format_bytes(self.bytes)}"
        if self.path != "engine" and self.by_reason:
            text += " (" + ", ".join(f"{reason} {ops}" for reason, ops in sorted(self.by_reason.items())) + ")"
        if self.timed_ops > 0 and self.busy_s > 0:
            text += f" in {self.busy_s:.3g} s"
            if self.bytes_per_s is not None:
                text += f" at {self.bytes_per_s / 1e9:.3g} GB/s"
            if self.of_bound is not None:
                text += f" ({self.of_bound * 100:.0f}% of bound)"
        if self.saved_s is not None:
            other = "engine" if self.path != "engine" else delegate_name(self.device)
            verb = "saved" if self.saved_s >= 0 else "lost"
            text += f", {verb} ~{abs(self.saved_s):.3g} s against {other}"
        return text


@dataclass(frozen=True)
class Summary:
    """One rank's view of one group; `line()` says it in one line."""

    rank: int
    rows: list[PathUsage]
    bound: str  # the machine NIC rate the fractions of the bound use, and where it came from

    def line(self) -> str:
        if not self.rows:
            return f"rank {self.rank}: no all-reduce, reduce-scatter or all-gather ran"
        kinds: dict[tuple[str, str], list[str]] = {}
        for row in self.rows:
            kinds.setdefault((row.device, row.collective), []).append(row.describe())
        said = "; ".join(f"{device} {collective}: {', '.join(paths)}" for (device, collective), paths in kinds.items())
        return f"rank {self.rank}: {said}; bound: {self.bound}"


def summary(group: dist.ProcessGroup | None = None, nic_gbps: float | None = None) -> Summary:
    """What `group`'s (default: the world's) collectives went through on this rank, so far.

    `nic_gbps`: each machine's NIC rate, for the fraction of the bound, where the
    kernel does not report it (virtual NICs, shaped links). Local: no rank waits for another.
    """
    return summarize(_fairring_backend(group), load_config(), nic_gbps)


def summarize(backend: _C.Backend, config: Config, nic_gbps: float | None = None) -> Summary:
    topology = backend.topology
    rate, bound = _machine_rate(config, topology, nic_gbps)
    rows = []
    for usage in backend.usage():
        device, collective = usage["device"], usage["collective"]
        on_engine = usage["path"] == "engine"
        busy = usage["busy_s"]
        timed = usage["timed_bytes"]
        bound_s = COLLECTIVES[collective].bound_s(timed, topology.num_machines, rate) if rate else None
        rows.append(
            PathUsage(
                device=device,
                collective=collective,
                path="engine" if on_engine else delegate_name(device),
                ops=usage["ops"],
                bytes=usage["bytes"],
                timed_ops=usage["timed_ops"],
                busy_s=busy,
                bytes_per_s=timed / busy if busy > 0 else None,
                of_bound=bound_s / busy if bound_s is not None and busy > 0 else None,
                saved_s=_saved(backend.measured_threshold(device, collective), usage["by_size"], on_engine),
                by_reason=dict(usage["by_reason"]),
            )
        )
    return Summary(topology.rank, rows, bound)


def log_at_shutdown(backend: _C.Backend, config: Config) -> None:
    """destroy_process_group: the summary at INFO from the group's rank 0, at DEBUG from the others."""
    level = logging.INFO if backend.topology.rank == 0 else logging.DEBUG
    if not logger.isEnabledFor(level):
        return
    try:
        said = summarize(backend, config).line()
    except Exception as error:  # a courtesy: never a reason for shutdown to fail
        said = f"rank {backend.topology.rank}: no summary ({error})"
    logger.log(level, "what fairring did for this group: %s", said)


def _fairring_backend(group: dist.ProcessGroup | None) -> _C.Backend:
    try:
        return backend_of(group, "cpu")
    except ValueError:
        return backend_of(group, "cuda")  # "cpu:gloo,cuda:fairring"


def _machine_rate(config: Config, topology: _C.Topology, nic_gbps: float | None) -> tuple[float | None, str]:
    """Bytes per second one machine's rails' NICs carry together, and where that came from."""
    if nic_gbps is not None:
        return nic_gbps * 1e9 / 8, f"{nic_gbps:g} Gbit/s per machine (given)"
    try:
        addresses = host_addresses()
        names = sorted({choose_rail_interface(config, rail, addresses).name for rail in range(topology.local_size)})
    except Exception as error:
        return None, f"unknown ({error})"
    speeds = [nic_speed_mbps(name) for name in names]
    if None in speeds:
        return None, f"unknown: the kernel reports no speed for {', '.join(names)} (summary's nic_gbps sets it)"
    total = sum(speed for speed in speeds if speed is not None)
    return total * 1e6 / 8, f"{total / 1000:g} Gbit/s per machine ({', '.join(names)}, from sysfs)"


def _saved(measured: dict[str, Any] | None, by_size: Sequence[tuple[int, int, int]], on_engine: bool) -> float | None:
    """Seconds this path saved against the other over these ops, by auto's sweep; None where it did not sweep."""
    if measured is None or not measured["sizes"]:
        return None
    sweep = sorted(measured["sizes"], key=lambda size: size["bytes"])
    saved = 0.0
    for _, ops, nbytes in by_size:
        mean = nbytes / ops
        engine_s = _at(sweep, mean, "engine_s")
        delegate_s = _at(sweep, mean, "delegate_s")
        saved += ops * (delegate_s - engine_s if on_engine else engine_s - delegate_s)
    return saved


def _at(sweep: Sequence[dict[str, Any]], nbytes: float, path: str) -> float:
    """One op's seconds at `nbytes` on `path`: log-log between the sweep's sizes; its smallest
    size's below them (latency), in proportion to the bytes above them (bandwidth)."""
    if nbytes <= sweep[0]["bytes"]:
        return float(sweep[0][path])
    if nbytes >= sweep[-1]["bytes"]:
        return float(sweep[-1][path]) * nbytes / sweep[-1]["bytes"]
    for lower, upper in itertools.pairwise(sweep):
        if nbytes <= upper["bytes"]:
            fraction = math.log(nbytes / lower["bytes"]) / math.log(upper["bytes"] / lower["bytes"])
            return float(lower[path] * (upper[path] / lower[path]) ** fraction)
    raise AssertionError("unreachable: nbytes lies within the sweep")
