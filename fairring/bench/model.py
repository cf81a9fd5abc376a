"""An alpha-beta cost model of fairring's all-reduce, against ring and tree all-reduces.

docs/model.md writes every formula out and says where each comes from. This module is pure
arithmetic over numpy and fairring._sizes: it runs nothing of the engine.

Times are in seconds, sizes in bytes, rates in bytes per second.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fairring._config import DEFAULT_SLICE_SIZE, DEFAULT_SLICES_IN_FLIGHT, DEFAULT_TOTAL_MEMORY
from fairring._sizes import GiB, KiB, parse_rate, parse_size

# Slices a tensor is cut into when it is long enough (plan.h kPipelineDepth).
PIPELINE_DEPTH = 8
# Stages of one slice: local reduce-scatter, rails (out, reduce, back), local all-gather.
STAGES = 3


@dataclass(frozen=True)
class Params:
    """What the hardware and software cost. docs/model.md, "Parameters", says what each means."""

    link_Bps: float  # one NIC, one direction
    alpha_s: float  # one network message's latency
    nics_per_machine: int
    local_Bps: float  # one rank's intra-machine send rate
    local_alpha_s: float  # one intra-machine message's latency
    slice_cpu_s: float  # fixed cost of one slice in one stage
    reduce_Bps: float  # bytes of one operand folded into an accumulator per second
    gap_s: float = 0.0  # sender time per network message: k messages take alpha + (k - 1) gap
    delegate: Literal["gloo", "nccl"] = "gloo"  # what all-reduces fairring does not serve run on


@dataclass(frozen=True)
class FairringSettings:
    """The environment variables that shape a plan (docs/configuration.md)."""

    slice_size: int = DEFAULT_SLICE_SIZE  # FAIRRING_SLICE_SIZE
    total_memory: int = DEFAULT_TOTAL_MEMORY  # FAIRRING_TOTAL_MEMORY
    min_shard: int | None = None  # FAIRRING_MIN_SHARD_SIZE; None: no floor (the old behaviour)
    flat_threshold: int = 0  # FAIRRING_FLAT_THRESHOLD; smaller tensors take the delegate
    # FAIRRING_SLICES_IN_FLIGHT; None: as many as total_memory holds (engines before the cap)
    slices_in_flight: int | None = DEFAULT_SLICES_IN_FLIGHT
    adaptive: bool = True  # False: every slice is slice_size, as at commit b87b7f0 (the slice sweep)
    # Adaptive slices are no shorter than slice_size / this: 2 since commit 775dc7a, 4 before.
    shortest_slice_divisor: int = 2


@dataclass(frozen=True)
class Plan:
    """How one all-reduce is cut (csrc/engine/plan.cpp), in bytes."""

    slice_bytes: int  # every slice but the last
    slices: int
    last_bytes: int  # the last slice, padded to the unit
    shard_bytes: float  # slice_bytes / (ranks_per_machine x machines)
    inflight: int  # full slices in flight: what total_memory holds, at most slices_in_flight
    below_floor: bool  # the floor asked for a slice that staging cannot hold


# The emulated cluster of docs/benchmarks.md: hosts on one 2-core VM, one shaped NIC per host.
EMULATED = Params(
    link_Bps=125e6,
    alpha_s=5e-4,
    nics_per_machine=1,
    local_Bps=2e9,
    local_alpha_s=2e-4,
    slice_cpu_s=3e-4,
    reduce_Bps=2e9,
)

# A GPU cluster like the one the original fairring was measured on (V100 machines, InfiniBand):
# 8 GPUs and 4 x 100 Gbit/s NICs per machine, NVLink inside; NCCL is the delegate.
# docs/model.md, "GPU-like defaults", gives the reasons for each value.
GPU_CLUSTER = Params(
    link_Bps=12.5e9,
    alpha_s=8e-6,
    nics_per_machine=4,
    local_Bps=150e9,
    local_alpha_s=3e-6,
    slice_cpu_s=20e-6,
    reduce_Bps=500e9,
    gap_s=2e-6,
    delegate="nccl",
)
GPU_RANKS_PER_MACHINE = 8
GPU_MIN_SHARD = 64 * KiB

# --- the plan --------------------------------------------------------------------------------


def _align(size: int, to: int = 64) -> int:
    return -(-size // to) * to


def staging_bytes(slice_bytes: int, ranks_per_machine: int, machines: int, padded: bool) -> int:
    """One slice's staging lease (staging.cpp stagingLayoutFor): L + 1 slots, L more if padded."""
    smallest = ranks_per_machine * machines * 8  # one element of the largest type per pair
    slot = _align(max(slice_bytes, smallest) // ranks_per_machine)
    return (ranks_per_machine + 1 + (ranks_per_machine if padded else 0)) * slot


def _base_slice(tensor_bytes: int, settings: FairringSettings) -> int:
    # plan.cpp sliceBytesFor: 8 slices deep, but none below half the maximum.
    if not settings.adaptive:
        return settings.slice_size
    deep = -(-tensor_bytes // PIPELINE_DEPTH)
    shortest = max(1, settings.slice_size // settings.shortest_slice_divisor)
    return min(max(deep, shortest), settings.slice_size)


def _largest_fitting_slice(ranks_per_machine: int, machines: int, budget: int, unit: int) -> int:
    """The largest multiple of `unit` whose unpadded staging fits `budget` (at least one unit)."""
    guess = budget * ranks_per_machine // (ranks_per_machine + 1) // unit * unit
    while guess > unit and staging_bytes(guess, ranks_per_machine, machines, False) > budget:
        guess -= unit
    return max(guess, unit)


def plan(
    tensor_bytes: int,
    machines: int,
    ranks_per_machine: int,
    settings: FairringSettings,
    element_bytes: int = 4,
) -> Plan:
    """The slices of one all-reduce, by plan.cpp's rules plus the shard floor (docs/model.md)."""
    L, M = ranks_per_machine, machines
    unit = L * M * element_bytes  # one element per (local rank, machine): CPU's shortest shard
    wanted = _base_slice(tensor_bytes, settings)
    below_floor = False
    if settings.min_shard is not None:
        floor_slice = L * M * settings.min_shard
        # Two slices must stay in flight, so a slice's staging gets at most half the memory.
        cap = _largest_fitting_slice(L, M, settings.total_memory // 2, unit)
        wanted = max(wanted, min(floor_slice, cap))
        # Shards of a tensor shorter than the floor's slice are small whatever the plan.
        below_floor = wanted < min(floor_slice, tensor_bytes)
    slice_bytes = max(1, wanted // unit) * unit  # plan.cpp sliceNumelFor
    if tensor_bytes <= slice_bytes:
        padded = max(unit, _align(tensor_bytes, unit))
        inflight = _in_flight(settings.total_memory // staging_bytes(padded, L, M, True), settings)
        return Plan(padded, 1, padded, padded / (L * M), inflight, False)
    slices = -(-tensor_bytes // slice_bytes)
    last = _align(tensor_bytes - (slices - 1) * slice_bytes, unit)
    inflight = _in_flight(settings.total_memory // staging_bytes(slice_bytes, L, M, False), settings)
    return Plan(slice_bytes, slices, last, slice_bytes / (L * M), inflight, below_floor)


def _in_flight(fitting: int, settings: FairringSettings) -> int:
    cap = settings.slices_in_flight
    return max(1, fitting if cap is None else min(fitting, cap))


# --- fairring's pipeline ---------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One stage of one slice: how long the slice spends in it, and how long it keeps it busy."""

    latency_s: float
    busy_s: float


def _messages(count: int, params: Params) -> float:
    # k messages to k peers, posted back to back: the last lands alpha + (k - 1) gaps after the first.
    return params.alpha_s + (count - 1) * params.gap_s if count > 0 else 0.0


def _local_step(slice_bytes: float, L: int, params: Params) -> float:
    """A local all-to-all or all-gather of a slice: L - 1 parts of B / L each way (a copy if L = 1)."""
    moved = slice_bytes if L == 1 else (L - 1) / L * slice_bytes
    return params.slice_cpu_s + (L - 1) * params.local_alpha_s + moved / params.local_Bps


def stages(slice_bytes: float, machines: int, L: int, params: Params) -> tuple[Stage, Stage, Stage]:
    """The three stages of one slice of `slice_bytes` (docs/model.md, "fairring")."""
    M, B = machines, slice_bytes
    scatter = _local_step(B, L, params) + (L - 1) / L * B / params.reduce_Bps
    # Each rank sends M - 1 shards of B/(LM) out and as many back: per machine 2(M-1)/M x B
    # through its NICs, whichever ranks share them.
    wire = 2 * (M - 1) / M * B / (params.nics_per_machine * params.link_Bps)
    reduce = (M - 1) * B / (L * M) / params.reduce_Bps
    # Two resources serve this stage, each on its own slice at a time: the NICs (the wire) and
    # the rank's CPU (slice bookkeeping, posting 2(M - 1) messages, the reduction).
    cpu = params.slice_cpu_s + 2 * (M - 1) * params.gap_s + reduce
    rails_busy = max(wire, cpu)
    rails_latency = params.slice_cpu_s + 2 * _messages(M - 1, params) + wire + reduce
    gather = _local_step(B, L, params)
    return Stage(scatter, scatter), Stage(rails_latency, rails_busy), Stage(gather, gather)


def _period(slice_stages: Sequence[Stage], inflight: int) -> float:
    """Time between two slices leaving the pipeline: the busiest stage, or the staging limit.

    A slice holds its staging through all stages, so k leases let at most k slices through per
    sum-of-latencies (Little's law).
    """
    total = sum(stage.latency_s for stage in slice_stages)
    return max(max(stage.busy_s for stage in slice_stages), total / max(1, inflight))


def pipeline_time(slice_groups: Sequence[tuple[Sequence[Stage], int]], inflight: int) -> float:
    """Slices through the stages: the first one's latency, then one period per further slice.

    `slice_groups` lists (stages of one slice, how many such slices), first slice first.
    """
    first = sum(stage.latency_s for stage in slice_groups[0][0])
    rest = sum(count * _period(group, inflight) for group, count in slice_groups)
    return first + rest - _period(slice_groups[0][0], inflight)


def fairring_time(
    tensor_bytes: int,
    machines: int,
    ranks_per_machine: int,
    params: Params,
    settings: FairringSettings,
    ops: int = 1,
) -> float:
    """`ops` back-to-back all-reduces of `tensor_bytes` through fairring (their slices pipeline)."""
    if machines == 1 or tensor_bytes < settings.flat_threshold:
        return ops * delegate_time(tensor_bytes, machines, ranks_per_machine, params)
    if tensor_bytes == 0:
        return 0.0
    p = plan(tensor_bytes, machines, ranks_per_machine, settings)
    full = stages(p.slice_bytes, machines, ranks_per_machine, params)
    last = stages(p.last_bytes, machines, ranks_per_machine, params)
    groups = [(full, ops * (p.slices - 1)), (last, ops)] if p.slices > 1 else [(last, ops)]
    return pipeline_time(groups, p.inflight)


# --- the delegate's algorithms and the bound --------------------------------------------------


def ring_time(
    tensor_bytes: int, machines: int, ranks_per_machine: int, params: Params, pipelined: bool = False
) -> float:
    """A ring all-reduce over all M x L ranks, ordered by machine: 2(N - 1) steps of S / N.

    Synchronous (Gloo): every step waits for its slowest edge, which crosses machines when M > 1.
    Pipelined (NCCL): a step's latency is paid on the critical path only, 2(M - 1) of them across
    machines; the bandwidth term is the same. On several NICs, one ring per NIC carries S / nics.
    """
    M, N = machines, machines * ranks_per_machine
    if N == 1 or tensor_bytes == 0:
        return 0.0
    chunk = tensor_bytes / N
    steps = 2 * (N - 1)
    reduce = (N - 1) * chunk / params.reduce_Bps
    local = chunk / params.local_Bps
    if M == 1:
        return steps * (params.local_alpha_s + local) + reduce
    network = chunk / (params.nics_per_machine * params.link_Bps)
    if not pipelined:
        return steps * max(params.alpha_s + network, params.local_alpha_s + local) + reduce
    latency = 2 * (M - 1) * params.alpha_s + (steps - 2 * (M - 1)) * params.local_alpha_s
    return latency + steps * max(network, local) + reduce


# NCCL's own correction of its tree's bandwidth for the Simple protocol, by log2(size / 64 B), from
# 64 B to 256 MiB (src/graph/tuning.cc treeCorrectionFactor, NVIDIA/nccl 5067397); 1 elsewhere.
NCCL_TREE_CORRECTION = (0.9,) * 7 + (0.8, 0.7, 0.6, 0.6) + (0.5,) * 4 + (0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9)
# NCCL's tree all-reduce reaches 0.92 of its bus bandwidth at best (same file).
NCCL_TREE_EFFICIENCY = 0.92


def _tree_correction(tensor_bytes: int) -> float:
    index = (tensor_bytes >> 6).bit_length() - 1
    return NCCL_TREE_CORRECTION[index] if 0 <= index < len(NCCL_TREE_CORRECTION) else 1.0


def tree_time(tensor_bytes: int, machines: int, ranks_per_machine: int, params: Params) -> float:
    """NCCL's double binary tree over machines, a chain inside each (NCCL's tuning model).

    Latency: 2((L - 1) local_alpha + floor(log2 M) alpha). Each machine sends and receives 2S
    through its NICs (interior in one tree, leaf in the other), at NCCL's tree efficiency.
    """
    M, L = machines, ranks_per_machine
    if M * L == 1 or tensor_bytes == 0:
        return 0.0
    latency = 2 * ((L - 1) * params.local_alpha_s + int(math.log2(M)) * params.alpha_s)
    efficiency = NCCL_TREE_EFFICIENCY * _tree_correction(tensor_bytes)
    network = 2 * tensor_bytes / (params.nics_per_machine * params.link_Bps * efficiency) if M > 1 else 0.0
    chain = 2 * tensor_bytes / params.local_Bps
    return latency + max(network, chain) + tensor_bytes / params.reduce_Bps


def nccl_time(tensor_bytes: int, machines: int, ranks_per_machine: int, params: Params) -> float:
    """NCCL picks the faster of its pipelined ring and its tree."""
    ring = ring_time(tensor_bytes, machines, ranks_per_machine, params, pipelined=True)
    return min(ring, tree_time(tensor_bytes, machines, ranks_per_machine, params))


def delegate_time(tensor_bytes: int, machines: int, ranks_per_machine: int, params: Params) -> float:
    """The all-reduce of the delegate group: Gloo's synchronous ring, or NCCL."""
    if params.delegate == "nccl":
        return nccl_time(tensor_bytes, machines, ranks_per_machine, params)
    return ring_time(tensor_bytes, machines, ranks_per_machine, params)


def bound_time(tensor_bytes: int, machines: int, params: Params) -> float:
    """The fastest any all-reduce can push 2(M - 1)/M x S through one machine's NICs."""
    return 2 * (machines - 1) / machines * tensor_bytes / (params.nics_per_machine * params.link_Bps)


def crossover(
    machines: int,
    ranks_per_machine: int,
    params: Params,
    settings: FairringSettings,
    sizes: Sequence[int] | None = None,
) -> int | None:
    """The smallest size from which fairring beats the delegate at every larger size tried."""
    sizes = sizes if sizes is not None else size_grid(64 * KiB, GiB, per_octave=8)
    wins = [
        fairring_time(s, machines, ranks_per_machine, params, settings)
        < delegate_time(s, machines, ranks_per_machine, params)
        for s in sizes
    ]
    if not wins[-1]:
        return None
    first = len(wins) - 1
    while first > 0 and wins[first - 1]:
        first -= 1
    return sizes[first]


def size_grid(smallest: int, largest: int, per_octave: float = 1) -> list[int]:
    """Sizes from `smallest` to `largest`, `per_octave` per doubling, rounded to 64 bytes."""
    octaves = math.log2(largest / smallest)
    count = round(octaves * per_octave) + 1
    return [_align(round(smallest * 2 ** (i / per_octave))) for i in range(count)]


# --- measured records ------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One measurement of `python -m fairring.bench` (a row of its JSON `records`)."""

    source: str  # the file's name
    study: str
    backend: str  # "gloo" or "fairring"
    tensor_bytes: int
    machines: int
    ranks_per_machine: int
    link: str | None  # tc rate of every NIC; None on loopback
    ops: int  # buckets all-reduced back to back
    inflight: int | None
    median_s: float  # for all `ops`
    settings: FairringSettings

    @property
    def per_op_s(self) -> float:
        return self.median_s / self.ops


def _settings_of(environment: Mapping[str, str], fixed_slices: bool, shortest_slice: int | None) -> FairringSettings:
    default = FairringSettings()

    def size(name: str, fallback: int) -> int:
        raw = environment.get(name)
        return parse_size(name, raw, allow_zero=True) if raw is not None else fallback

    slice_size = size("FAIRRING_SLICE_SIZE", default.slice_size)
    return FairringSettings(
        slice_size=slice_size,
        total_memory=size("FAIRRING_TOTAL_MEMORY", default.total_memory),
        min_shard=size("FAIRRING_MIN_SHARD_SIZE", 0) or None,
        flat_threshold=size("FAIRRING_FLAT_THRESHOLD", default.flat_threshold),
        adaptive=not fixed_slices,
        # Records from before commit 775dc7a do not name the shortest slice: theirs was a quarter.
        shortest_slice_divisor=slice_size // shortest_slice if shortest_slice else 4,
        # Records from before the cap name no such setting: their engines had none.
        slices_in_flight=int(environment["FAIRRING_SLICES_IN_FLIGHT"])
        if "FAIRRING_SLICES_IN_FLIGHT" in environment
        else None,
    )


def _record_settings(row: Mapping[str, Any], base: FairringSettings) -> FairringSettings:
    inflight = row.get("inflight")
    if not isinstance(inflight, int):
        return base
    # The overlap study sizes staging for exactly `inflight` full slices (fairring/bench/__main__.py).
    L, M = int(row["ranks_per_machine"]), int(row["machines"])
    one = plan(int(row["bytes"]), M, L, base).slice_bytes
    memory = max(inflight * staging_bytes(one, L, M, False), staging_bytes(one, L, M, True))
    return replace(base, total_memory=memory, slices_in_flight=inflight)


def load_records(paths: Iterable[Path | str]) -> list[Record]:
    """Every record of the given bench JSON files.

    Files named `*fixed-*` (docs/benchmarks/slice-sweep) were measured before slices adapted to
    the tensor: their slices are all FAIRRING_SLICE_SIZE.
    """
    records: list[Record] = []
    for path in map(Path, paths):
        document = json.loads(path.read_text())
        environment = document.get("environment", {})
        # Newer records name every setting that shaped the plans; older ones only those set.
        settings = environment.get("fairring_settings") or environment.get("fairring_env", {})
        base = _settings_of(
            {k: str(v) for k, v in settings.items()},
            fixed_slices="fixed-" in path.name,
            shortest_slice=environment.get("fairring_plan", {}).get("shortest_slice"),
        )
        for row in document["records"]:
            records.append(
                Record(
                    source=path.name,
                    study=row["study"],
                    backend=row["backend"],
                    tensor_bytes=int(row["bytes"]),
                    machines=int(row["machines"]),
                    ranks_per_machine=int(row["ranks_per_machine"]),
                    link=row.get("link"),
                    ops=int(row.get("buckets") or 1),
                    inflight=row.get("inflight"),
                    median_s=float(row["median_s"]),
                    settings=_record_settings(row, base),
                )
            )
    return records


# What TCP carries of a shaped link's rate: tc counts every segment's headers, and a 1500-byte MTU
# frame (1514 bytes with the Ethernet header) carries 1448 bytes of payload (TCP timestamps on).
TCP_GOODPUT = 1448 / 1514


def emulated_params(link: str | None) -> Params:
    """EMULATED with the TCP goodput of `link`; on loopback, a start for the fitted rate."""
    rate = parse_rate(link) * TCP_GOODPUT if link is not None else EMULATED.local_Bps
    return replace(EMULATED, link_Bps=rate)


def model_time(record: Record, params: Params) -> float:
    """The model's time for one op of `record`."""
    S, M, L = record.tensor_bytes, record.machines, record.ranks_per_machine
    if record.backend == "fairring":
        return fairring_time(S, M, L, params, record.settings, ops=record.ops) / record.ops
    return delegate_time(S, M, L, params)


def residuals(records: Sequence[Record], params: Params) -> np.ndarray:
    """log(model / measured) per record."""
    model = np.array([model_time(record, params) for record in records])
    measured = np.array([record.per_op_s for record in records])
    return np.log(model / measured)


# --- calibration -----------------------------------------------------------------------------

# What calibrate() fits unless told otherwise; link_Bps joins them on loopback.
FITTED = ("alpha_s", "local_alpha_s", "slice_cpu_s", "local_Bps", "reduce_Bps")
# Weight of the pull toward the starting values, per squared e-fold: far below any residual a
# record leaves, so only directions no record constrains feel it.
PRIOR_WEIGHT = 1e-4
# Where a fitted parameter may go: wide, but keeps a parameter the data hardly sees finite.
_BOUNDS = {
    "link_Bps": (1e6, 1e13),
    "alpha_s": (1e-8, 1.0),
    "local_alpha_s": (1e-8, 1.0),
    "slice_cpu_s": (1e-8, 1.0),
    "gap_s": (1e-9, 1.0),
    "local_Bps": (1e6, 1e14),
    "reduce_Bps": (1e6, 1e14),
}


def calibrate(
    records: Sequence[Record],
    fixed: Mapping[str, float] | None = None,
    start: Params | None = None,
    fitted: Sequence[str] = FITTED,
) -> Params:
    """Least squares of log(model / measured) over `records`, all on one link setting.

    Fits `fitted` (and link_Bps on loopback) in log space with Nelder-Mead; `fixed` pins values.
    """
    links = {record.link for record in records}
    if len(links) != 1:
        raise ValueError(f"calibrate one link setting at a time, not {sorted(map(str, links))}")
    link = links.pop()
    fixed = dict(fixed or {})
    base = replace(start or emulated_params(link), **fixed)
    names = [name for name in fitted if name not in fixed]
    if link is None and "link_Bps" not in fixed and "link_Bps" not in names:
        names.append("link_Bps")
    low = np.log([_BOUNDS[name][0] for name in names])
    high = np.log([_BOUNDS[name][1] for name in names])

    def at(x: np.ndarray) -> Params:
        values = np.exp(np.clip(x, low, high))
        return replace(base, **dict(zip(names, map(float, values), strict=True)))

    x0 = np.log([getattr(base, name) for name in names])

    def cost(x: np.ndarray) -> float:
        # The pull toward the start keeps a parameter the records cannot see where it was.
        return float(np.mean(residuals(records, at(x)) ** 2) + PRIOR_WEIGHT * np.sum((x - x0) ** 2))

    x = x0
    for _ in range(3):  # restarts: Nelder-Mead's simplex can collapse before the minimum
        x = _nelder_mead(cost, x, step=1.0)
    return at(x)


def _nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float, iters: int = 3000) -> np.ndarray:
    """Minimise `f` from `x0` (the textbook reflect/expand/contract/shrink simplex)."""
    simplex = np.vstack([x0] + [x0 + step * np.eye(len(x0))[i] for i in range(len(x0))])
    values = np.array([f(x) for x in simplex])
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = simplex[order], values[order]
        if values[-1] - values[0] < 1e-12 and np.ptp(simplex, axis=0).max() < 1e-6:
            break
        centroid = simplex[:-1].mean(axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            inner = fr >= values[-1]
            contracted = centroid + 0.5 * ((simplex[-1] if inner else reflected) - centroid)
            fc = f(contracted)
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                values[1:] = [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def params_from_dict(values: Mapping[str, object]) -> Params:
    """Params from a JSON object such as the command writes; missing fields keep EMULATED's."""
    known = {field.name for field in fields(Params)}
    return replace(EMULATED, **{k: v for k, v in values.items() if k in known})  # type: ignore[arg-type]
