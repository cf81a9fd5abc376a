"""The NIXL rails (FAIRRING_RAILS_TRANSPORT=nixl): results against a plain torch reference."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist

import fairring
from benchmarks.harness import InitSpec, Layout, RankPool
from benchmarks.reference import assert_matches, rank_tensor
from nixl_support import NIXL_ENV, needs_nixl

pytestmark = needs_nixl


def sum_matches(numel: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = rank_tensor(rank, (numel,), torch.float32)
    dist.all_reduce(tensor)
    expected = torch.stack([rank_tensor(r, (numel,), torch.float64) for r in range(world)]).sum(0)
    assert_matches(tensor, expected.float())
    return dist.group.WORLD._get_backend(torch.device("cpu")).engine_stats("cpu")


@pytest.mark.timeout(240)
def test_all_reduce_matches_torch_on_2x2() -> None:
    with RankPool(Layout(2, 2), InitSpec(extra_env=NIXL_ENV)) as ranks:
        for numel in [1, 1000, 1_000_003, 4_000_000]:
            for stats in ranks.run(sum_matches, numel, timeout=120):
                assert stats["rail_bytes_sent"] > 0, stats


SLOW_RECEIVER = {"FAIRRING_TEST_NIXL_SLOW_RECEIVER_MS": "20"}
IN_FLIGHT = 6
NUMEL = 1 << 20


def torch_sum(seed: int) -> torch.Tensor:
    return torch.stack([rank_tensor(r, (NUMEL,), torch.int64, seed) for r in range(dist.get_world_size())]).sum(0)


def many_in_flight(seed: int) -> tuple[bool, str]:
    """IN_FLIGHT all-reduces issued at once; whether every result matched torch's, and the rails' account."""
    # Integers: every result is exact, so any overwritten byte shows.
    tensors = [rank_tensor(dist.get_rank(), (NUMEL,), torch.int64, seed + i) for i in range(IN_FLIGHT)]
    works = [dist.all_reduce(tensor, async_op=True) for tensor in tensors]
    for work in works:
        work.wait()
    matched = all(torch.equal(tensor, torch_sum(seed + i)) for i, tensor in enumerate(tensors))
    return matched, fairring.backend_of().rails("cpu")["description"]


def waited(rails: str) -> int:
    return int(re.search(r"(\d+) write\(s\) waited for their grant", rails).group(1))


@pytest.mark.timeout(240)
def test_a_slow_receiver_gets_every_message_in_memory_it_granted() -> None:
    """Receivers that hold each message 20 ms make senders wait for grants; every result is still exact."""
    with RankPool(Layout(2, 2), InitSpec(extra_env=NIXL_ENV | SLOW_RECEIVER)) as ranks:
        for seed in range(3):
            outcomes = ranks.run(many_in_flight, seed, timeout=120)
            assert all(matched for matched, _ in outcomes), outcomes
        assert all(waited(rails) > 0 for _, rails in outcomes), outcomes


@pytest.mark.timeout(240)
def test_negative_control_writes_without_grants_give_wrong_results() -> None:
    """A sender that writes into the last grant's memory at once, as one without flow control would,
    overwrites messages the slow receiver still holds: the check above sees wrong results."""
    knobs = NIXL_ENV | SLOW_RECEIVER | {"FAIRRING_TEST_NIXL_UNGRANTED_WRITES": "1"}
    with RankPool(Layout(2, 2), InitSpec(extra_env=knobs)) as ranks:
        outcomes = [matched for seed in range(3) for matched, _ in ranks.run(many_in_flight, seed, timeout=120)]
    assert not all(outcomes), "writes without grants went unnoticed"
