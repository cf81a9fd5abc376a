"""The paths compared and the timed, checked sweep over sizes."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

import fairring
from fairring._introspection import delegate_name
from fairring.bench.turns import time_in_turns

from .check import count_wrong, expected_result, rank_input

ENGINE = "fairring"
ENGINE_OFF = "fairring-engine-off"


@dataclass(frozen=True)
class Contender:
    """One way to all-reduce: a group of every rank and what it stands for."""

    name: str
    description: str
    group: dist.ProcessGroup


@dataclass
class Measurement:
    """One path at one size on this rank: every timed iteration's seconds, and wrong elements seen."""

    seconds: list[float] = field(default_factory=list)
    wrong: int = 0


@dataclass(frozen=True)
class Row:
    """One path at one size across ranks: the slowest rank's median, and every rank's wrong elements."""

    nbytes: int
    count: int
    median_s: float
    wrong: int


def make_paths(device: torch.device, timeout: timedelta) -> list[Contender]:
    """Every rank makes the same groups in the same order; the engine's first, the delegate's second."""
    engine = fairring.Options(engine=True, flat_threshold=0)
    delegate = delegate_name(device)
    paths = [
        Contender(
            ENGINE,
            "fairring's engine at every size (fairring.Options(engine=True, flat_threshold=0))",
            dist.new_group(backend="fairring", pg_options=engine, timeout=timeout),
        ),
        Contender(delegate, f"{delegate}'s own all-reduce", dist.new_group(backend=delegate, timeout=timeout)),
    ]
    if device.type == "cuda":
        off = dist.new_group(backend="fairring", pg_options=fairring.Options(engine=False), timeout=timeout)
        paths.append(Contender(ENGINE_OFF, "fairring with its engine off (fairring.Options(engine=False))", off))
    return paths


def synchronizer(device: torch.device) -> Callable[[], None]:
    """Waits for the device's queued work: an op is done when its result is."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


@dataclass(frozen=True)
class Buffers:
    """One op's memory: the N-chunk tensor and this rank's chunk, a view of it in place or apart."""

    whole: torch.Tensor
    chunk: torch.Tensor
    collective: str
    apart: bool  # out of place: the chunk is not a view of the whole

    @staticmethod
    def make(source: torch.Tensor, rank: int, world: int, collective: str, out_of_place: bool) -> Buffers:
        whole = torch.empty_like(source)
        # In place, as nccl-tests' in-place column and FSDP have it: the chunk is this rank's of the whole.
        mine = whole.view(world, -1)[rank]
        return Buffers(whole, torch.empty_like(mine) if out_of_place else mine, collective, out_of_place)

    @property
    def result(self) -> torch.Tensor:
        return self.chunk if self.collective == "reduce_scatter" else self.whole

    def reset(self, source: torch.Tensor, rank: int, world: int) -> None:
        """The op's input from `source`; an output apart from it poisoned (NaN), so one left unwritten is wrong."""
        if self.collective == "all_gather":
            self.whole.fill_(float("nan"))
            self.chunk.copy_(source.view(world, -1)[rank])
        else:
            self.whole.copy_(source)
            if (
                self.collective == "reduce_scatter"
                and self.chunk.data_ptr() != self.whole.view(world, -1)[rank].data_ptr()
            ):
                self.chunk.fill_(float("nan"))


@dataclass
class Sweep:
    """Times every path at one size on the same tensor, the paths' order alternating per iteration."""

    paths: list[Contender]
    coordinator: dist.ProcessGroup  # Gloo: barriers and reductions of the results, outside the timings
    device: torch.device
    dtype: torch.dtype
    iters: int
    warmup: int
    corrupt: bool = False  # negative control: rank 0 damages the engine's results before they are checked
    collective: str = "all_reduce"
    in_flight: int = 1  # ops issued back to back before any is waited for
    out_of_place: bool = False  # a reduce-scatter's output, an all-gather's input: buffers of their own

    def measure(self, count: int) -> dict[str, Measurement]:
        rank, world = dist.get_rank(), dist.get_world_size()
        source = rank_input(rank, count, self.dtype, self.device)
        expected = expected_result(self.collective, rank, world, count, self.dtype, self.device)
        # One set of buffers per op in flight: each op its own memory, as back-to-back buckets have.
        slots = [Buffers.make(source, rank, world, self.collective, self.out_of_place) for _ in range(self.in_flight)]
        groups = {path.name: path.group for path in self.paths}
        measured = {name: Measurement() for name in groups}

        def fill(_: str) -> None:
            for slot in slots:
                slot.reset(source, rank, world)

        def run(name: str) -> None:
            works = [self._issue(slot, groups[name]) for slot in slots]
            for work in works:
                work.wait()

        def check(name: str) -> None:
            if self.corrupt and rank == 0 and name == ENGINE:
                slots[-1].result[0] += 1
            measured[name].wrong += sum(count_wrong(slot.result, expected) for slot in slots)

        seconds = time_in_turns(
            list(groups),
            warmup=self.warmup,
            iters=self.iters,
            fill=fill,
            run=run,
            check=check,
            sync=synchronizer(self.device),
            barrier=lambda: dist.barrier(group=self.coordinator),
        )
        for name, times in seconds.items():
            # Per op, as nccl-tests divides the time of its ops issued back to back.
            measured[name].seconds = [elapsed / len(slots) for elapsed in times]
        return measured

    def _issue(self, slot: Buffers, group: dist.ProcessGroup) -> dist.Work:
        if self.collective == "all_reduce":
            return dist.all_reduce(slot.whole, group=group, async_op=True)
        if self.collective == "reduce_scatter":
            return dist.reduce_scatter_tensor(slot.chunk, slot.whole, group=group, async_op=True)
        return dist.all_gather_into_tensor(slot.whole, slot.chunk, group=group, async_op=True)

    def across_ranks(self, count: int, measured: dict[str, Measurement]) -> dict[str, Row]:
        """Each path's slowest median (MAX over ranks) and total wrong elements (SUM over ranks)."""
        names = [path.name for path in self.paths]
        medians = torch.tensor([statistics.median(measured[name].seconds) for name in names], dtype=torch.float64)
        wrong = torch.tensor([measured[name].wrong for name in names], dtype=torch.int64)
        dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=self.coordinator)
        dist.all_reduce(wrong, group=self.coordinator)
        nbytes = count * self.dtype.itemsize
        return {
            name: Row(nbytes, count, float(median), int(bad))
            for name, median, bad in zip(names, medians.tolist(), wrong.tolist(), strict=True)
        }

    def run(self, count: int) -> dict[str, Row]:
        return self.across_ranks(count, self.measure(count))


def element_counts(sizes: list[int], dtype: torch.dtype, world_size: int = 1) -> list[int]:
    """Elements per size, as nccl-tests counts them: at least one, and N whole chunks where `world_size` says."""
    return [max(world_size, size // dtype.itemsize // world_size * world_size) for size in sizes]


def geometric_sizes(smallest: int, largest: int, factor: int) -> list[int]:
    """smallest, smallest x factor, ... up to largest, as nccl-tests' -b, -e and -f."""
    sizes = [smallest]
    while sizes[-1] * factor <= largest:
        sizes.append(sizes[-1] * factor)
    return sizes
