"""The soak's ranks: random collectives, each checked, with threads, descriptors and memory flat.

Every rank of a RankPool (harness.py) draws the same sequence from one seed:
batches of 1 to 8 operations, mostly all-reduces of log-uniform sizes (1 element
to Plan.max_bytes), dtypes and reduce ops, plus all_gather_into_tensor, broadcast
and barrier, issued asynchronously and finished by work.wait() or through
get_future().then(). Each goes to one of two fairring groups over all ranks: the
world group, whose engine takes every size (FAIRRING_FLAT_THRESHOLD=0, the
default), or one made with a 256 KiB threshold, where smaller all-reduces take the
delegate (Gloo). Bool tensors and bitwise ops take the delegate on both. Every
result is checked against plain torch arithmetic on every rank's input
(reference.py), and threads, open descriptors and RSS are read after a warm-up and
at the end. tests/test_soak.py is the short run; benchmarks/soak.py (`make soak`)
the long one.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import fairring
from benchmarks.harness import make_flat_group
from benchmarks.reference import REDUCE_OPS, reduce_reference

MiB = 1 << 20
FLAT_GROUP_THRESHOLD = "256KiB"
# Drawn with these weights; ops per dtype are drawn uniformly from OPS_OF.
DTYPE_WEIGHTS = {
    "float32": 3.0,
    "float64": 1.0,
    "float16": 1.0,
    "bfloat16": 1.0,
    "int32": 1.0,
    "int64": 1.0,
    "int8": 0.5,
    "uint8": 0.5,
    "bool": 0.5,
}
FLOAT_OPS = ("sum", "min", "max", "product", "avg", "premul_sum")
INT_OPS = ("sum", "min", "max", "product", "band", "bor", "bxor")
BOOL_OPS = ("sum", "min", "max", "product")
KIND_WEIGHTS = {"all_reduce": 0.85, "all_gather": 0.06, "broadcast": 0.06, "barrier": 0.03}


def ops_of(dtype: str) -> tuple[str, ...]:
    if dtype == "bool":
        return BOOL_OPS
    return FLOAT_OPS if getattr(torch, dtype).is_floating_point else INT_OPS


@dataclass(frozen=True)
class Plan:
    """What to run: `ops` operations (0: no limit) or `minutes` of them, whichever ends first."""

    ops: int
    seed: int = 0
    minutes: float = 0.0
    warmup_ops: int = 300
    max_bytes: int = 4 * MiB


@dataclass(frozen=True)
class Step:
    index: int
    kind: str  # all_reduce, all_gather, broadcast or barrier
    group: str  # "engine" (the world group) or "flat" (the 256 KiB threshold group)
    dtype: str
    op: str  # the reduce op of an all-reduce, else ""
    numel: int
    finish: str  # "sync", "wait" or "then"
    root: int = 0  # broadcast's source


def batches(seed: int, world_size: int, max_bytes: int) -> Iterator[list[Step]]:
    """The endless sequence of batches every rank draws from `seed`."""
    rng = random.Random(seed)
    index = 0
    while True:
        batch = []
        size = rng.randint(1, 8)
        for _ in range(size):
            kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
            dtype = rng.choices(list(DTYPE_WEIGHTS), weights=list(DTYPE_WEIGHTS.values()))[0]
            element = torch.empty((), dtype=getattr(torch, dtype)).element_size()
            limit = max_bytes // world_size if kind == "all_gather" else max_bytes
            draw = rng.random()
            if draw < 0.01:
                numel = 0
            elif draw < 0.06:
                numel = rng.randint(1, 7)  # around one unit (L x M elements on the CPU): mostly padding
            else:  # log-uniform bytes; most counts do not divide by the world size
                numel = max(1, int(2 ** rng.uniform(0, math.log2(max(1, limit // element)))))
            finish = "sync" if kind == "barrier" or (size == 1 and rng.random() < 0.5) else rng.choice(("wait", "then"))
            batch.append(
                Step(
                    index=index,
                    kind=kind,
                    group=rng.choice(("engine", "engine", "flat")),
                    dtype=dtype,
                    op=rng.choice(ops_of(dtype)) if kind == "all_reduce" else "",
                    numel=numel,
                    finish=finish,
                    root=rng.randrange(world_size),
                )
            )
            index += 1
        yield batch


def premul_factor(rank: int) -> float:
    return 0.5 + 0.25 * rank


def rank_input(step: Step, rank: int, seed: int) -> torch.Tensor:
    """Rank `rank`'s input to `step`, which every rank can recompute (drawn as reference.py's
    rank_tensor draws, but in float32, which is ten times faster than float64 at these sizes)."""
    generator = torch.Generator().manual_seed((seed * 1_000_003 + step.index) * 7919 + rank)
    shape = (step.numel,)
    if step.dtype == "bool":
        return torch.randint(0, 2, shape, generator=generator).bool()
    dtype = getattr(torch, step.dtype)
    if dtype.is_floating_point:
        values = torch.randn(shape, generator=generator)
        if step.op == "product":  # within [0.75, 1.25]: products of a few stay near 1
            values = values.abs_().clamp_(max=0.5).add_(0.75)
        return values.to(dtype)
    low, high = (1, 3) if step.op == "product" else (0, 20)  # sums and products fit int8
    return torch.randint(low, high, shape, generator=generator, dtype=dtype)


def wide(tensor: torch.Tensor) -> torch.Tensor:
    """A float64 copy (a copy even of a float64 tensor, so that in-place arithmetic leaves it be)."""
    return tensor.to(torch.float64, copy=True)


def float_problem(step: Step, actual: torch.Tensor, inputs: list[torch.Tensor]) -> str | None:
    """Why `actual` is not the floating-point all-reduce of `inputs`, or None.

    Min and max must be exact. A sum of n terms, however ordered, rounds n - 1
    times, so its error is within (n - 1) x u x the sum of their magnitudes (u =
    eps / 2, the unit roundoff); premultiplying or averaging rounds once more. The
    bound used, n x eps x that sum, is twice that; a product of n terms is held to
    n x eps x its magnitude, on the same reasoning.
    """
    n = len(inputs)
    if step.op in ("min", "max"):
        combine = torch.minimum if step.op == "min" else torch.maximum
        expected = functools.reduce(combine, inputs)
        return None if torch.equal(actual, expected) else "differs from the exact " + step.op
    if step.op == "product":
        expected = wide(inputs[0])
        for tensor in inputs[1:]:
            expected.mul_(tensor)
        magnitude = expected.abs()
    else:
        expected = torch.zeros(actual.shape, dtype=torch.float64)
        magnitude = torch.zeros_like(expected)
        for rank, tensor in enumerate(inputs):
            term = wide(tensor).mul_(premul_factor(rank)) if step.op == "premul_sum" else wide(tensor)
            expected.add_(term)
            magnitude.add_(term.abs_())
        if step.op == "avg":
            expected.div_(n)
            magnitude.div_(n)
    bound = magnitude.mul_(n * torch.finfo(actual.dtype).eps)
    excess = wide(actual).sub_(expected).abs_().sub_(bound)
    if step.numel == 0 or excess.max().item() <= 0:
        return None
    worst = int(excess.argmax())
    return (
        f"element {worst}: {actual[worst].item()}, expected {expected[worst].item()} within {bound[worst].item():.3g}"
    )


def all_reduce_problem(step: Step, actual: torch.Tensor, inputs: list[torch.Tensor]) -> str | None:
    """Why `actual` is not the all-reduce of `inputs`, or None. Integers and bools must be exact."""
    if actual.dtype.is_floating_point:
        return float_problem(step, actual, inputs)
    if step.dtype == "bool":  # c10d's bool reductions are logical: sum and max are OR, min and product AND
        stacked = torch.stack(inputs)
        expected = stacked.any(0) if step.op in ("sum", "max") else stacked.all(0)
    else:
        expected = reduce_reference(inputs, step.op)
    return None if torch.equal(actual, expected) else "differs from the exact reduction"


def problem_of(step: Step, actual: torch.Tensor, inputs: list[torch.Tensor]) -> str | None:
    if step.kind == "all_reduce":
        return all_reduce_problem(step, actual, inputs)
    expected = torch.cat(inputs) if step.kind == "all_gather" else inputs[step.root]
    return None if torch.equal(actual, expected) else f"differs from the {step.kind} of the inputs"


@dataclass
class Pending:
    step: Step
    result: torch.Tensor
    finish: Callable[[], object]
    # What a then() callback of an all-reduce saw: the result must be there when it runs.
    seen: list[torch.Tensor] = field(default_factory=list)


def issue(step: Step, group: dist.ProcessGroup, rank: int, world_size: int, seed: int) -> Pending:
    async_op = step.finish != "sync"
    tensor = rank_input(step, rank, seed)
    result = tensor
    work: dist.Work | None
    if step.kind == "barrier":
        work = dist.barrier(group=group, async_op=async_op)
    elif step.kind == "broadcast":
        work = dist.broadcast(tensor, src=step.root, group=group, async_op=async_op)
    elif step.kind == "all_gather":
        result = torch.empty(world_size * step.numel, dtype=tensor.dtype)
        work = dist.all_gather_into_tensor(result, tensor, group=group, async_op=async_op)
    else:
        if step.op == "premul_sum":
            factor = premul_factor(rank)
            wrapped = torch.tensor([factor], dtype=torch.float64) if step.index % 2 else factor
            reduce_op = dist._make_nccl_premul_sum(wrapped)
        else:
            reduce_op = REDUCE_OPS[step.op]
        work = dist.all_reduce(tensor, op=reduce_op, group=group, async_op=async_op)
    if work is None:
        return Pending(step, result, lambda: None)
    if step.finish != "then":
        return Pending(step, result, work.wait)
    pending = Pending(step, result, lambda: None)

    def on_done(done: torch.futures.Future) -> None:
        value = done.value()
        if step.kind == "all_reduce":
            pending.seen.append(value[0].clone())

    pending.finish = work.get_future().then(on_done).wait
    return pending


@dataclass(frozen=True)
class Resources:
    threads: int
    fds: int
    rss_bytes: int
    thread_names: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"threads {self.threads}, fds {self.fds}, RSS {self.rss_bytes / MiB:.1f} MiB"


def resources() -> Resources:
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return Resources(
        threads=len(os.listdir("/proc/self/task")),
        fds=len(os.listdir("/proc/self/fd")),
        rss_bytes=resident_pages * os.sysconf("SC_PAGE_SIZE"),
        thread_names=tuple(sorted(thread_name(task) for task in os.listdir("/proc/self/task"))),
    )


def thread_name(task: str) -> str:
    try:
        with open(f"/proc/self/task/{task}/comm") as comm:
            return comm.read().strip()
    except FileNotFoundError:  # it left while we looked
        return "(gone)"


def release_free_memory() -> None:
    """Hands free heap memory back to the OS (glibc's malloc_trim, every arena), so RSS counts
    what is held rather than what the allocator keeps after the checks' large transients."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS includes the allocator's cache
        pass


def settled_resources(quiet_s: float = 2.5, limit_s: float = 8.0) -> Resources:
    """Resources once the thread count has held still for `quiet_s`: the engine keeps one
    completion worker and lets the others leave after 2 s idle (docs/design.md, Threads)."""
    release_free_memory()
    deadline = time.monotonic() + limit_s
    last = resources()
    still_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - still_since < quiet_s:
        time.sleep(0.25)
        now = resources()
        if now.threads != last.threads:
            still_since = time.monotonic()
        last = now
    return last


@dataclass
class Report:
    """What one rank saw."""

    rank: int
    ops: int = 0
    seconds: float = 0.0
    check_seconds: float = 0.0  # computing references and comparing
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)  # by (dtype, reduce op or collective)
    groups: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    failure_count: int = 0
    start: Resources | None = None
    warm: Resources | None = None
    end: Resources | None = None
    # Per group: its engine's counters and staging peak, at the warm-up point and at the end.
    warm_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    end_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    # (ops run, RSS bytes), every 100 ops
    rss_trace: list[tuple[int, int]] = field(default_factory=list)


def group_stats(groups: dict[str, dist.ProcessGroup]) -> dict[str, dict[str, int]]:
    """Engine all-reduces, delegated ones and the staging peak of each group's engine (zeros: none yet)."""
    stats = {}
    for name, group in groups.items():
        backend = fairring.backend_of(group)
        engine, staging = backend.engine_stats() or {}, backend.staging_stats() or {}
        stats[name] = {
            "engine_ops": engine.get("ops", 0),
            "delegated_ops": engine.get("flat_ops", 0),
            "staging_peak_bytes": staging.get("peak_bytes_in_use", 0),
        }
    return stats


def check_batch(pending: list[Pending], report: Report, seed: int, world_size: int) -> None:
    checking = time.monotonic()
    for item in pending:
        step = item.step
        report.counts[(step.dtype, step.op or step.kind)] += 1
        report.groups[step.group] += 1
        if step.kind == "barrier":
            continue
        inputs = [rank_input(step, r, seed) for r in range(world_size)]
        problem = problem_of(step, item.result, inputs)
        if problem is None and item.seen and not torch.equal(item.seen[0], item.result):
            problem = "its then() callback saw another value than wait() left"
        if problem is not None:
            report.failure_count += 1
            if len(report.failures) < 20:
                report.failures.append(f"rank {report.rank} seed {seed}: {step}: {problem}")
    report.check_seconds += time.monotonic() - checking


def run_rank(plan: Plan) -> Report:
    """Runs `plan` on this rank of an initialised fairring world group; rank 0 prints progress."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    groups = {"engine": dist.group.WORLD, "flat": make_flat_group(FLAT_GROUP_THRESHOLD)}
    report = Report(rank=rank, start=settled_resources(quiet_s=0.0))
    began = time.monotonic()
    deadline = began + plan.minutes * 60 if plan.minutes > 0 else None
    next_progress = began + 30
    for batch in batches(plan.seed, world_size, plan.max_bytes):
        pending = [issue(step, groups[step.group], rank, world_size, plan.seed) for step in batch]
        for item in reversed(pending) if batch[0].index % 2 else pending:
            item.finish()
        check_batch(pending, report, plan.seed, world_size)
        if report.ops // 100 != (report.ops + len(batch)) // 100:
            release_free_memory()
            report.rss_trace.append((report.ops + len(batch), resources().rss_bytes))
        report.ops += len(batch)
        if report.warm is None and report.ops >= plan.warmup_ops:
            dist.barrier()
            report.warm = settled_resources()
            report.warm_stats = group_stats(groups)
        if rank == 0 and time.monotonic() >= next_progress:
            print(f"soak: {report.ops} ops, {time.monotonic() - began:.0f} s, {resources().describe()}", flush=True)
            next_progress += 30
        if stop_now(plan, report.ops, deadline):
            break
    report.seconds = time.monotonic() - began
    dist.barrier()
    report.end = settled_resources()
    report.end_stats = group_stats(groups)
    dist.destroy_process_group(groups["flat"])
    return report


def stop_now(plan: Plan, ops: int, deadline: float | None) -> bool:
    """Whether every rank stops here; time is agreed on by an all-reduce, so all stop after the same batch."""
    if plan.ops and ops >= plan.ops:
        return True
    if deadline is None:
        return False
    flag = torch.tensor([int(time.monotonic() >= deadline)], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


# Growth allowed between the warm-up point and the end, per rank. Threads and
# descriptors: none, once idle completion workers have left (settled_resources).
# RSS (after malloc_trim) creeps up for the first few thousand operations, then
# holds. Measured on 2 x 2 ranks with 4 MiB tensors: 6 to 30 MiB from a warm-up at
# 300 ops to the end of 2,000 to 2,500 (seeds 0, 1, 2, 11); over 15,100 ops (seed
# 5), 28 to 34 MiB from 300 ops, 16 to 22 MiB from 2,800 and -3 to 5 MiB from 4,200.
# Part is the staging ring's high-water mark (peak in use: 4 to 7 MiB at 300 ops, 6
# to 11 MiB at 2,000). The limit is about twice the largest figure:
RSS_GROWTH_LIMIT = 64 * MiB


def growth_problems(report: Report, rss_limit: int = RSS_GROWTH_LIMIT) -> list[str]:
    warm, end = report.warm, report.end
    if warm is None or end is None:
        return [f"rank {report.rank}: no warm-up point ({report.ops} ops run)"]
    problems = []
    if end.threads > warm.threads:
        added = Counter(end.thread_names) - Counter(warm.thread_names)
        problems.append(f"rank {report.rank}: threads {warm.threads} -> {end.threads}, new: {dict(added)}")
    if end.fds > warm.fds:
        problems.append(f"rank {report.rank}: fds {warm.fds} -> {end.fds}")
    if end.rss_bytes - warm.rss_bytes > rss_limit:
        problems.append(
            f"rank {report.rank}: RSS grew {(end.rss_bytes - warm.rss_bytes) / MiB:.1f} MiB "
            f"(limit {rss_limit / MiB:.0f} MiB)"
        )
    return problems


def summary(plan: Plan, reports: list[Report]) -> str:
    first = reports[0]
    lines = [
        f"soak: seed {plan.seed}, {first.ops} ops in {first.seconds:.1f} s "
        f"({first.ops / max(first.seconds, 1e-9):.0f} ops/s; {first.check_seconds:.1f} s of it checking on rank 0), "
        f"{sum(r.failure_count for r in reports)} failures",
    ]
    columns = [*FLOAT_OPS, *INT_OPS[4:], "all_gather", "broadcast", "barrier"]
    lines.append(f"{'':<10}" + "".join(f"{column:>11}" for column in columns))
    for dtype in DTYPE_WEIGHTS:
        lines.append(f"{dtype:<10}" + "".join(f"{first.counts.get((dtype, c), 0) or '':>11}" for c in columns))
    lines.append("by group: " + ", ".join(f"{name} {count}" for name, count in sorted(first.groups.items())))
    lines.append(f"{'rank':<6}{'':<8}{'threads':>9}{'fds':>6}{'RSS MiB':>10}")
    for report in reports:
        for when, value in (("start", report.start), ("warm", report.warm), ("end", report.end)):
            if value is not None:
                lines.append(f"{report.rank:<6}{when:<8}{value.threads:>9}{value.fds:>6}{value.rss_bytes / MiB:>10.1f}")
    for report in reports:
        for name, end in report.end_stats.items():
            peaks = (report.warm_stats.get(name, {}).get("staging_peak_bytes", 0), end["staging_peak_bytes"])
            lines.append(
                f"rank {report.rank} {name} group: {end['engine_ops']} engine all-reduces, "
                f"{end['delegated_ops']} delegated below the threshold; staging peak "
                f"{peaks[0] / MiB:.1f} MiB at warm-up, {peaks[1] / MiB:.1f} at the end"
            )
    for report in reports:
        trace = " ".join(f"{rss / MiB:.0f}" for _, rss in report.rss_trace[:: max(1, len(report.rss_trace) // 20)])
        lines.append(f"rank {report.rank} RSS MiB every {100 * max(1, len(report.rss_trace) // 20)} ops: {trace}")
    for report in reports:
        lines += report.failures
    return "\n".join(lines)
