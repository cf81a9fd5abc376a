"""FAIRRING_FLAT_THRESHOLD=auto: time the engine against the delegate, check them, pick its sizes.

At a group's first all-reduce the engine could take, every rank runs the same
sweep: float32 all-reduces of sizes on a ladder, on the engine and on the
delegate's own all-reduce, a few back to back on each after an untimed one.
16 MiB first; where the engine does not win there, the sizes above it, up the
ladder until it wins; then the rest, smallest up. Both paths reduce the same
random inputs, and their results must agree within what a different summation
order explains; one int32 all-reduce must agree exactly. Reduce-scatters and
all-gathers are measured apart, each at the group's first of its kind the
engine could take, the same way (sizes are of the N-chunk tensor, on a ladder
twice the all-reduce's; an all-gather's results must agree exactly). After
each size the ranks share their timings and differences through the CPU
group, so every rank sees the same table and makes the same decision: the run
of sizes in which the engine saves the most time, won at both ends and nowhere
slower beyond noise (a threshold, and a ceiling where the engine lost above
it), or never. The sweep stops early once the engine has won clearly at two
sizes in a row and at 16 MiB, and before a size its time limit would not hold.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from ._config import ENGINE_OFF_THRESHOLD
from ._free_memory import gpu_free_bytes, host_available_bytes
from ._known_variables import TEST_SWITCH_PREFIX
from ._sizes import KiB, MiB, format_size

logger = logging.getLogger("fairring")

# The most bytes one size of the sweep allocates for its input: the bench's largest default size.
SWEEP_LARGEST = 256 * MiB
# A rank holds about this many tensors of the size it measures: the input, each path's result, and
# the next result or their difference. The climb takes a size only where every rank has room for them.
TENSORS_HELD = 4
# float32 sizes from 4 KiB by 4x. The sweep starts at the seventh, 16 MiB: as large a start as
# its default time limit holds on 1 Gbit/s hosts (8 x 1: 4-4.5 s of the 5, docs/benchmarks.md,
# "Choosing the path by measuring"). Where the engine does not win there, it climbs while the
# limit allows: on a 2 x 2 on one H200 at 10 Gbit/s, reduce-scatters and all-gathers lost at
# 16 MiB and won by 1.4x at 64 MiB, a crossover a sweep that stopped at 16 MiB never saw
# (docs/benchmarks.md, "On a GPU"). Sizes above the largest measured go as it does.
LADDER = tuple(4 * KiB * 4**step for step in range(9))
START = 6
# A reduce-scatter or an all-gather of S bytes puts on a machine's NICs what an all-reduce of S / 2
# does, so their ladder is twice as large: the same wire time at every step, the same time limit.
CHUNKED_LADDER = tuple(2 * nbytes for nbytes in LADDER if 2 * nbytes <= SWEEP_LARGEST)
REPS = 3
# Faster by this much at two sizes in a row from 256 KiB up and at the start, the engine wins
# the sizes between too: the sweep stops there.
CLEAR_WIN = 1.25
CLEAR_FROM = 256 * KiB
# Slower by at most this is noise: it does not end a run of sizes the engine takes.
NOISE = 0.05
# A cached decision is measured again only where the check finds the other path faster by more
# than this: the sizes checked lie around the decision's bounds, where the two paths are close by
# construction, and noise alone must not throw a good decision away (a changed network moves them
# by more: 1.4x in the case that asked for the check).
STALE_MARGIN = 1.2
# Each size costs about this many times the one before it, once bandwidth is what counts.
GROWTH = 4
INTEGER_CHECK_BYTES = 256 * KiB
# No size above which the delegate takes over again.
NO_CEILING = ENGINE_OFF_THRESHOLD
# Test-only: this rank corrupts one element of each engine result, which the check must catch.
CORRUPT_ENGINE_RESULT = "FAIRRING_TEST_CORRUPT_ENGINE_RESULT"

# One collective of the kind measured (SUM where it reduces) of `input` into `output` (the same
# tensor for an all-reduce) over the group, on the engine (True) or the delegate; waited for.
Run = Callable[[torch.Tensor, torch.Tensor, bool], None]
# The kinds measured apart, and what the INFO line and errors call many of each.
COLLECTIVES = {"all_reduce": "all-reduces", "reduce_scatter": "reduce-scatters", "all_gather": "all-gathers"}
# Every rank's row of numbers, as a table with one row per rank, the same on every rank.
Exchange = Callable[[Sequence[float]], torch.Tensor]


@dataclass(frozen=True)
class SizeTiming:
    """One size: on each path, the fastest of REPS all-reduces, each as slow as its slowest rank."""

    nbytes: int
    engine_s: float
    delegate_s: float

    @property
    def speedup(self) -> float:
        return self.delegate_s / self.engine_s


@dataclass
class Decision:
    """What the measurement decided, and why (csrc/backend/measured_threshold.h reads it)."""

    threshold: int
    reason: str
    source: str = "measured"
    sizes: list[SizeTiming] = field(default_factory=list)
    # The engine's result differed from the delegate's: never cached, checked again next job.
    disagreed: bool = False
    # The delegate again from this size up; NO_CEILING: the engine takes every size from the threshold.
    ceiling: int = NO_CEILING


@dataclass(frozen=True)
class Disagreement:
    """The engine's result differed from the delegate's by more than the bound."""

    nbytes: int
    dtype: torch.dtype
    largest: float
    bound: float
    ranks: tuple[int, ...]

    def describe(self, delegate: str, collective: str = "all_reduce") -> str:
        ranks = ", ".join(str(rank) for rank in self.ranks)
        allowed = "none" if self.bound == 0 else f"{self.bound:.3g}"
        many = COLLECTIVES[collective]
        return (
            f"the engine's {many[:-1]} of {format_size(self.nbytes)} of {str(self.dtype).removeprefix('torch.')} "
            f"differs from {delegate}'s on rank(s) {ranks}: largest difference {self.largest:.6g}, "
            f"allowed {allowed}; the engine is off for this group's {many}, every one goes to {delegate}. "
            "Please report this with the output of `python -m fairring.validate`"
        )


def choose_sizes(sizes: Sequence[SizeTiming]) -> tuple[int, int]:
    """(threshold, ceiling) of the run of measured sizes the engine should take; never: both off.

    Of the runs that the engine wins at both ends and loses nowhere beyond
    noise, the one that saves the most time per all-reduce of each size. A run
    reaching the largest size measured has no ceiling: larger sizes go as it does.
    """
    best, most_saved = (ENGINE_OFF_THRESHOLD, NO_CEILING), 0.0
    for first, start in enumerate(sizes):
        if not start.engine_s < start.delegate_s:
            continue
        saved = 0.0
        for last in range(first, len(sizes)):
            timing = sizes[last]
            if timing.engine_s > timing.delegate_s * (1 + NOISE):
                break
            saved += max(0.0, timing.delegate_s - timing.engine_s)  # a loss within noise is noise
            if timing.engine_s < timing.delegate_s and saved > most_saved:
                ceiling = NO_CEILING if last == len(sizes) - 1 else sizes[last + 1].nbytes
                best, most_saved = (start.nbytes, ceiling), saved
    return best


def explain(threshold: int, ceiling: int, sizes: Sequence[SizeTiming], delegate: str) -> str:
    """The INFO line's verdict: "engine 1.48x gloo from 1MiB; below, gloo"."""
    if threshold == ENGINE_OFF_THRESHOLD:
        best = max(sizes, key=lambda timing: timing.speedup)
        at_best = f"{best.speedup:.2f}x {delegate} ({format_size(best.nbytes)})"
        return f"{delegate} at every size: the engine was at best {at_best}"
    speedups = [timing.speedup for timing in sizes if threshold <= timing.nbytes < ceiling]
    low, high = min(speedups), max(speedups)
    ratio = f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"
    engine = f"engine {ratio} {delegate} from {format_size(threshold)}"
    if ceiling == NO_CEILING:
        return f"{engine}; below, {delegate}"
    return f"{engine} to below {format_size(ceiling)}; outside, {delegate}"


def clear_win(sizes: Sequence[SizeTiming]) -> bool:
    """The engine won by CLEAR_WIN at the last two sizes, both at least CLEAR_FROM."""
    last = sizes[-2:]
    return len(last) == 2 and all(t.nbytes >= CLEAR_FROM and t.speedup >= CLEAR_WIN for t in last)


def ladder(collective: str) -> tuple[int, ...]:
    """The sizes swept for `collective`, smallest first."""
    return LADDER if collective == "all_reduce" else CHUNKED_LADDER


def measured_text(measured: Sequence[int], sizes: Sequence[int] = LADDER) -> str:
    """The sizes of the ladder `sizes` measured, as runs of its steps: "4KiB to 16MiB", "4KiB to
    1MiB and 16MiB to 64MiB"."""
    runs: list[list[int]] = []
    for nbytes in sorted(measured):
        if runs and sizes.index(nbytes) == sizes.index(runs[-1][-1]) + 1:
            runs[-1].append(nbytes)
        else:
            runs.append([nbytes])
    texts = [format_size(run[0]) + ("" if len(run) == 1 else f" to {format_size(run[-1])}") for run in runs]
    return " and ".join(texts)


def foresee(steps: dict[int, float], nbytes: int) -> float:
    """Seconds the sweep's step at `nbytes` will take, from those measured (`steps`, by size).

    A step costs a fixed part (its ops' latency, its barriers) plus a part per byte: between two
    measured sizes, linear in bytes; below them all, in proportion to the smallest; above them all,
    GROWTH times the largest, as if only bytes counted there.
    """
    below = [size for size in steps if size < nbytes]
    above = [size for size in steps if size > nbytes]
    if not above:
        return GROWTH * steps[max(below)]
    high = min(above)
    if not below:
        return steps[high] * nbytes / high
    low = max(below)
    return steps[low] + (steps[high] - steps[low]) * (nbytes - low) / (high - low)


def float_bound(world_size: int) -> float:
    """Largest difference two summation orders of `world_size` values in [-1, 1) can make in float32.

    Each order's error is at most (n - 1) * u * sum|x| <= (n - 1) * u * n, with u
    the unit roundoff; two orders differ by at most twice that. eps = 2u adds slack.
    """
    return 2 * (world_size - 1) * world_size * torch.finfo(torch.float32).eps


def rank_input(rank: int, nbytes: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """This rank's input at one size: reproducible, and different on every rank. Drawn on its device, so
    that a GPU's 256 MiB are not drawn by the host and copied within the time limit."""
    generator = torch.Generator(device=device).manual_seed(1_000_003 * rank + nbytes)
    numel = nbytes // torch.empty((), dtype=dtype).element_size()
    if dtype.is_floating_point:
        return torch.rand(numel, generator=generator, dtype=dtype, device=device).mul_(2).sub_(1)
    return torch.randint(-(1 << 20), 1 << 20, (numel,), generator=generator, dtype=dtype, device=device)


class Sweep:
    """One rank's part of the measurement: every rank runs it alike, in the same order."""

    def __init__(
        self,
        run: Run,
        exchange: Exchange,
        device: torch.device,
        rank: int,
        world_size: int,
        delegate: str,
        collective: str = "all_reduce",
        ranks_per_host: int = 1,
    ) -> None:
        if collective not in COLLECTIVES:
            raise ValueError(f"fairring: cannot measure {collective!r}; one of {', '.join(COLLECTIVES)}")
        self._collective = collective
        self._ladder = ladder(collective)
        self._run = run
        self._exchange = exchange
        self._device = device
        self._rank = rank
        self._world_size = world_size
        self._delegate = delegate
        self._ranks_per_host = ranks_per_host
        from . import _C

        corrupt = _C.test_switch(CORRUPT_ENGINE_RESULT.removeprefix(TEST_SWITCH_PREFIX))
        self._corrupt = corrupt is not None and int(corrupt) == rank

    def measure(self, budget_s: float) -> Decision:
        # Untimed, and outside the limit: makes the engine (as its first use would) and connects
        # both paths, and must agree to the bit.
        disagreement = self._check_integers()
        if disagreement is not None:
            return self._refused(disagreement)
        started = time.perf_counter()
        # The large sizes first: they decide the buckets that carry most bytes, so the time limit
        # may leave out sizes between, never the start. Then the rest, smallest up.
        steps: dict[int, float] = {}  # each size's seconds, to foresee the next one's
        high, disagreement, stopped = self._climb(started, budget_s, steps)
        if disagreement is not None:
            return self._refused(disagreement)
        start = high[0]
        ascending: list[SizeTiming] = []
        unmeasured = None
        for nbytes in self._ladder[:START]:
            if sum(steps.values()) + foresee(steps, nbytes) > budget_s:
                stopped += f"; {format_size(nbytes)} to below {format_size(start.nbytes)} not measured: "
                stopped += f"they would pass the {budget_s:g} s limit"
                unmeasured = nbytes
                break
            timing, disagreement = self._time_step(nbytes, started, steps)
            if disagreement is not None:
                return self._refused(disagreement)
            ascending.append(timing)
            if clear_win(ascending) and all(timing.speedup >= CLEAR_WIN for timing in high):
                stopped += "; stopped once the engine won clearly at two sizes in a row and at "
                stopped += format_size(start.nbytes)
                break
        sizes = [*ascending, *high]
        threshold, ceiling = choose_sizes(sizes)
        if unmeasured is not None and threshold < unmeasured < ceiling and not start.engine_s < start.delegate_s:
            # The sizes the limit left out lie between a win and the start, which the engine did
            # not win: where the paths cross between is unknown, so they go to the delegate.
            ceiling = unmeasured
        verdict = explain(threshold, ceiling, sizes, self._delegate)
        measured = measured_text([timing.nbytes for timing in sizes], self._ladder)
        reason = f"{verdict} (measured {measured} in {sum(steps.values()):.1f} s{stopped})"
        return Decision(threshold, reason, "measured", sizes, ceiling=ceiling)

    def _climb(
        self, started: float, budget_s: float, steps: dict[int, float]
    ) -> tuple[list[SizeTiming], Disagreement | None, str]:
        """The start and, while the engine does not win and the limit allows, each size above it:
        their timings, the disagreement that ended them, what the limit left out."""
        high: list[SizeTiming] = []
        for nbytes in self._ladder[START:]:
            left_out = f"; {format_size(nbytes)} and above not measured: "
            if high and sum(steps.values()) + foresee(steps, nbytes) > budget_s:
                return high, None, left_out + f"they would pass the {budget_s:g} s limit"
            short = self._short_of_room(nbytes) if high else ""
            if short:
                return high, None, left_out + short
            timing, disagreement = self._time_step(nbytes, started, steps)
            if disagreement is not None:
                return high, disagreement, ""
            high.append(timing)
            if timing.engine_s < timing.delegate_s:
                break
        return high, None, ""

    def _short_of_room(self, nbytes: int) -> str:
        """Which ranks lack room for the tensors of a size, as "rank(s) 2 had less than 1GiB free", or "" where
        none does; every rank asks alike, so all take the same next step (a rank that ran out alone would leave
        the others in a collective)."""
        needed = TENSORS_HELD * nbytes
        table = self._exchange([float(self._free_bytes())])
        short = ", ".join(str(rank) for rank, free in enumerate(table[:, 0].tolist()) if free < needed)
        return f"rank(s) {short} had less than {format_size(needed)} free" if short else ""

    def _free_bytes(self) -> int:
        """Bytes this rank may still take where it measures: its GPU's free memory and the caching allocator's
        free blocks, or its share of the host's available memory."""
        if self._device.type == "cuda":
            return gpu_free_bytes(self._device)
        return host_available_bytes() // self._ranks_per_host

    def _time_step(
        self, nbytes: int, started: float, steps: dict[int, float]
    ) -> tuple[SizeTiming, Disagreement | None]:
        """One size of the sweep, its seconds (the slowest rank's, from `started`) added to `steps`."""
        timing, disagreement, elapsed = self._time_size(nbytes, started)
        steps[nbytes] = elapsed - sum(steps.values())
        return timing, disagreement

    def verify(self, cached: Decision) -> tuple[Decision | None, str]:
        """Checks an earlier job's decision at the sizes on either side of each of its bounds, before
        trusting it: (the decision to use, or None to measure again; what the check found).

        A cache outlives its network (a NIC, a switch or a shaper changed, a home folder shared
        between clusters), and nothing in its key may show it. At each size checked, neither path
        may now be faster by STALE_MARGIN where the decision gives the size to the other, in two
        timings in a row.
        """
        expected = {nbytes: cached.threshold <= nbytes < cached.ceiling for nbytes in self._check_sizes(cached)}
        if not expected:
            return None, "its sizes are not this sweep's"
        started = time.perf_counter()

        def against(timing: SizeTiming, engine_takes: bool) -> bool:
            if engine_takes:
                return timing.engine_s > timing.delegate_s * STALE_MARGIN
            return timing.engine_s * STALE_MARGIN < timing.delegate_s

        unchecked = ""
        for nbytes, engine_takes in list(expected.items()):
            # Above the start, as the climb: only where every rank has room for the size.
            short = self._short_of_room(nbytes) if nbytes > self._ladder[START] else ""
            if short:
                del expected[nbytes]
                unchecked += f"; {format_size(nbytes)} not checked: {short}"
                continue
            timing, disagreement, _ = self._time_size(nbytes, started)
            if disagreement is None and against(timing, engine_takes):
                # One timing can be a busy moment's (small sizes swing most): the verdict must repeat.
                timing, disagreement, _ = self._time_size(nbytes, started)
            if disagreement is not None:
                return self._refused(disagreement), ""
            if against(timing, engine_takes):
                given = "the engine" if engine_takes else self._delegate
                now = f"the engine {timing.speedup:.2f}x {self._delegate} at {format_size(nbytes)}"
                return None, f"{now}, which it gives {given}"
        checked = ", ".join(format_size(nbytes) for nbytes in expected) or "no size"
        seconds = time.perf_counter() - started
        reason = f"{cached.reason}; checked now at {checked} in {seconds:.1f} s{unchecked}: kept"
        return replace(cached, reason=reason), ""

    def _check_sizes(self, cached: Decision) -> list[int]:
        """The ladder's sizes on either side of each bound of `cached`, and the largest it measured
        (the start, where it holds no table) where the engine's run reaches it or never starts;
        none where a bound is not one of the ladder's."""
        bounds = [bound for bound in (cached.threshold, cached.ceiling) if bound != NO_CEILING]
        largest = max((timing.nbytes for timing in cached.sizes), default=self._ladder[START])
        if any(bound not in self._ladder for bound in [*bounds, largest]):
            return []
        sizes = {largest} if len(bounds) < 2 else set()
        for bound in bounds:
            index = self._ladder.index(bound)
            sizes.update(self._ladder[max(index - 1, 0) : index + 1])
        return sorted(sizes)

    def _source(self, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        """This rank's input at one size: for a reduce-scatter or an all-gather, N whole chunks."""
        source = rank_input(self._rank, nbytes, dtype, self._device)
        if self._collective == "all_reduce":
            return source
        return source[: source.numel() - source.numel() % self._world_size]

    def _operands(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(output, input) of one collective of `source`, which it leaves as it is."""
        if self._collective == "all_reduce":
            tensor = source.clone()
            return tensor, tensor
        chunks = source.view(self._world_size, -1)
        if self._collective == "reduce_scatter":
            return torch.empty_like(chunks[0]), source
        return torch.empty_like(source), chunks[self._rank].clone()

    def _float_bound(self) -> float:
        # An all-gather moves values; the reductions may sum in another order.
        return 0.0 if self._collective == "all_gather" else float_bound(self._world_size)

    def _check_integers(self) -> Disagreement | None:
        source = self._source(INTEGER_CHECK_BYTES, torch.int32)
        engine, _ = self._path(source, on_engine=True, reps=1)
        delegate, _ = self._path(source, on_engine=False, reps=1)
        largest = (engine.double() - delegate.double()).abs().max().item()
        table = self._exchange([largest])
        return self._disagreement(INTEGER_CHECK_BYTES, torch.int32, table[:, 0], bound=0.0)

    def _time_size(self, nbytes: int, started: float) -> tuple[SizeTiming, Disagreement | None, float]:
        source = self._source(nbytes, torch.float32)
        # As the bench times: one path's all-reduces back to back after an untimed one, whose
        # traffic restarts what an idle link slows down (TCP's window after idle).
        engine, engine_s = self._path(source, on_engine=True, reps=1 + REPS)
        delegate, delegate_s = self._path(source, on_engine=False, reps=1 + REPS)
        engine_s, delegate_s = engine_s[1:], delegate_s[1:]
        largest = (engine - delegate).abs_().max().item()
        table = self._exchange([*engine_s, *delegate_s, largest, time.perf_counter() - started])
        # Each iteration takes as long as its slowest rank; the fastest of those, as a busy core or
        # a stalled link only ever adds time (the median of 3 let two such iterations decide).
        slowest = table[:, : 2 * REPS].max(dim=0).values.tolist()
        timing = SizeTiming(nbytes, min(slowest[:REPS]), min(slowest[REPS:]))
        disagreement = self._disagreement(nbytes, torch.float32, table[:, 2 * REPS], self._float_bound())
        return timing, disagreement, float(table[:, 2 * REPS + 1].max())

    def _path(self, source: torch.Tensor, on_engine: bool, reps: int) -> tuple[torch.Tensor, list[float]]:
        """`reps` collectives of `source` on one path: the last result, and each one's seconds."""
        seconds = []
        for _ in range(reps):
            result, read = self._operands(source)
            self._synchronize()
            # As the bench's barrier: every rank starts together, so that each one's time is the
            # op's, not the op's plus how long it waited for the last rank to start.
            self._exchange([0.0])
            begin = time.perf_counter()
            self._run(result, read, on_engine)
            self._synchronize()
            seconds.append(time.perf_counter() - begin)
        if on_engine and self._corrupt:
            result.view(-1)[0] += 1
        return result, seconds

    def _disagreement(
        self, nbytes: int, dtype: torch.dtype, largest: torch.Tensor, bound: float
    ) -> Disagreement | None:
        # NaN compares false: a NaN difference is a disagreement.
        ranks = tuple(rank for rank, value in enumerate(largest.tolist()) if not value <= bound)
        if not ranks:
            return None
        return Disagreement(nbytes, dtype, float(largest.nan_to_num(nan=float("inf")).max()), bound, ranks)

    def _refused(self, disagreement: Disagreement) -> Decision:
        reason = disagreement.describe(self._delegate, self._collective)
        logger.error("rank %d: %s", self._rank, reason)
        return Decision(ENGINE_OFF_THRESHOLD, reason, "measured", disagreed=True)

    def _synchronize(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
