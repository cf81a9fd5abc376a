"""What every rank runs while one of its machine's NICs goes down and comes back (rails failover).

Shared by tests/test_rails_failover.py (the short, checked run) and
benchmarks/failover_episode.py (the episode, timed). Every all-reduce's result
is checked against a plain torch sum of all ranks' inputs (reference.py).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import fairring
from benchmarks.reference import all_ranks_reduced, assert_matches, rank_tensor
from fairring.bench.netns import NetnsCluster

_state: dict[str, torch.Tensor] = {}


def prepare(size: int) -> str:
    """Builds the rails (and the reference) for all-reduces of `size` bytes; where the rails are."""
    _state["tensor"] = rank_tensor(dist.get_rank(), (size // 4,), torch.float32)
    _state["expected"] = all_ranks_reduced((size // 4,), torch.float32)
    dist.all_reduce(torch.ones(4096))
    return fairring.backend_of().rails()["description"]


def all_reduces(count: int) -> list[tuple[float, float]]:
    """`count` all-reduces, each checked: when each ended (time.time()) and how long it took."""
    times = []
    for _ in range(count):
        tensor = _state["tensor"].clone()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append((time.time(), time.perf_counter() - start))
        assert_matches(tensor, _state["expected"])
    return times


def all_reduces_for(seconds: float) -> list[tuple[float, float]]:
    """All-reduces, each checked, until `seconds` have passed on every rank; as all_reduces()."""
    times: list[tuple[float, float]] = []
    until = time.monotonic() + seconds
    going = torch.ones(1)
    while going.item() > 0:
        times += all_reduces(1)
        # The ranks agree on when to stop: each must issue as many all-reduces.
        going = torch.tensor([float(time.monotonic() < until)])
        dist.all_reduce(going, op=dist.ReduceOp.MIN)
    return times


def rails() -> str:
    return fairring.backend_of().rails()["description"]


def bytes_sent(cluster: NetnsCluster, interfaces: tuple[str, ...] = ("eth0", "eth1")) -> dict[str, list[int]]:
    """What each interface of each host has sent so far, by interface."""
    return {i: [cluster.counters(h, i)[0] for h in cluster.hosts] for i in interfaces}


def difference(after: dict[str, list[int]], before: dict[str, list[int]]) -> dict[str, list[int]]:
    return {i: [a - b for a, b in zip(after[i], before[i], strict=True)] for i in after}
