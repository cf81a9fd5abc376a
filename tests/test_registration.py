"""Registration, init methods, subgroups, discovered topology and init-time errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import InitSpec, Layout, RankFailure, RankPool, init_process_group
from benchmarks.reference import (
    all_ranks_reduced,
    assert_matches,
    expected_view,
    rank_tensor,
    reduce_reference,
    topology_view,
)
from fairring.bench import free_port
from nixl_support import rails_env


def backend_state() -> dict[str, object]:
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    topology = backend.topology
    return {
        "name": dist.get_backend(),
        "same_for_cuda": dist.group.WORLD._get_backend(torch.device("cuda")) is not None,
        "machine_ranks": topology.local_ranks,
        "local_rank": topology.local_rank,
        "rail_peers": topology.rail_peers,
        "num_machines": topology.num_machines,
        "timeout_s": backend.timeout.total_seconds(),
    }


def test_backend_reports_the_layout_it_was_given(pool: RankPool) -> None:
    layout = pool.layout
    states = pool.run(backend_state)
    for rank, state in enumerate(states):
        machine_ranks = layout.ranks_of(layout.machine_of(rank))
        assert state["name"] == "fairring"
        assert state["same_for_cuda"]
        assert state["num_machines"] == layout.machines
        assert state["machine_ranks"] == machine_ranks
        assert state["local_rank"] == machine_ranks.index(rank)
        # Rail peers: the rank with my local index on every machine.
        local = machine_ranks.index(rank)
        assert state["rail_peers"] == [layout.ranks_of(m)[local] for m in range(layout.machines)]
        assert state["timeout_s"] == 60


def sum_on_fresh_group() -> str:
    rank = dist.get_rank()
    tensor = rank_tensor(rank, (9,), torch.float32)
    dist.all_reduce(tensor)
    assert_matches(tensor, all_ranks_reduced((9,), torch.float32))
    return dist.get_backend()


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_init_methods(method: str, tmp_path: Path) -> None:
    spec = InitSpec(method=method, port=free_port(), path=str(tmp_path / "rendezvous"))
    with RankPool(Layout(2, 1), spec) as ranks:
        assert ranks.run(sum_on_fresh_group) == ["fairring", "fairring"]


def subgroup_collectives() -> dict[str, object]:
    """Two subgroups with one fairring backend each: the odd and the even ranks."""
    rank, size = dist.get_rank(), dist.get_world_size()
    evens, odds = list(range(0, size, 2)), list(range(1, size, 2))
    groups = [dist.new_group(evens, backend="fairring"), dist.new_group(odds, backend="fairring")]
    members = evens if rank % 2 == 0 else odds
    group = groups[rank % 2]
    tensor = rank_tensor(rank, (11,), torch.float64)
    dist.all_reduce(tensor, group=group)
    assert_matches(tensor, reduce_reference([rank_tensor(r, (11,), torch.float64) for r in members], "sum"))
    received = torch.empty(3)
    dist.broadcast(
        received if dist.get_group_rank(group, rank) else rank_tensor(rank, (3,), torch.float32),
        group_src=0,
        group=group,
    )
    if dist.get_group_rank(group, rank):
        assert_matches(received, rank_tensor(members[0], (3,), torch.float32))
    topology = group._get_backend(torch.device("cpu")).topology
    return {
        "backend": dist.get_backend(group),
        "group_rank": topology.rank,
        "view": topology_view(topology),
    }


def test_subgroups() -> None:
    layout = Layout(2, 2)
    with RankPool(layout) as ranks:
        results = ranks.run(subgroup_collectives)
    for rank, result in enumerate(results):
        assert result["backend"] == "fairring"
        members = list(range(rank % 2, layout.world_size, 2))
        assert result["group_rank"] == members.index(rank)
        # Each subgroup has one rank on each machine of the 2x2 layout.
        assert result["view"] == expected_view([[0], [1]], members.index(rank))


def expect_init_failure(layout: Layout, rank_env: dict[int, dict[str, str]]) -> dict[int, str]:
    ranks = RankPool(layout, rank_env=rank_env)
    try:
        ranks.start(init=False)
        with pytest.raises(RankFailure) as failure:
            ranks.init()
        return failure.value.outcomes
    finally:
        ranks.close()


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("FAIRRING_SLICE_SIZE", "25 bananas", "FAIRRING_SLICE_SIZE='25 bananas' is not a size"),
        ("FAIRRING_TOTAL_MEMORY", "-5", "FAIRRING_TOTAL_MEMORY='-5' is not a size"),
        ("FAIRRING_LOG_LEVEL", "LOUD", "FAIRRING_LOG_LEVEL='LOUD' is not a log level"),
    ],
)
def test_malformed_variable_is_rejected_at_init(variable: str, value: str, expected: str) -> None:
    outcomes = expect_init_failure(Layout(2, 1), {r: {variable: value} for r in range(2)})
    assert all(expected in outcome for outcome in outcomes.values()), outcomes


def test_settings_that_differ_across_ranks_are_rejected() -> None:
    outcomes = expect_init_failure(Layout(2, 1), {1: {"FAIRRING_SLICE_SIZE": "1MiB"}})
    for outcome in outcomes.values():
        assert "FAIRRING_SLICE_SIZE differs across ranks" in outcome, outcome
        assert "1: 1048576" in outcome, outcome


def init_capturing_logs(*init_args: object) -> list[str]:
    """Joins the process group and makes its engine while recording fairring's log messages."""
    import logging

    records: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Capture()
    logging.getLogger("fairring").addHandler(handler)
    try:
        init_process_group(*init_args)
        dist.all_reduce(torch.ones(8))  # the group's first all-reduce makes the engine and its rails
    finally:
        logging.getLogger("fairring").removeHandler(handler)
    return records


def test_configuration_and_rails_are_logged_in_debug() -> None:
    env = {"FAIRRING_LOG_LEVEL": "DEBUG", "FAIRRING_SLICE_SIZE": "4MiB", "FAIRRING_IB_DISABLE": "1"}
    # TensorPipe's decision is what is logged here (the NIXL rails' line: tests/test_without_tensorpipe.py).
    env |= rails_env("tensorpipe")
    with RankPool(Layout(2, 1), InitSpec(extra_env=env)).start(init=False) as ranks:
        records = ranks.run_per_rank(init_capturing_logs, ranks.init_args)
    for lines in records:
        assert any("effective configuration" in line and "FAIRRING_SLICE_SIZE=4MiB" in line for line in lines), lines
        # TP_SOCKET_IFNAME=lo (the harness) and InfiniBand off: TCP on loopback, chosen at init, then used.
        chosen = [line for line in lines if "rails on lo 127.0.0.1 (TP_SOCKET_IFNAME '=lo' matches lo" in line]
        assert len(chosen) == 1 and "rails transports uv; channels basic for CPU" in chosen[0], lines
        assert "ibv: not used: FAIRRING_IB_DISABLE=1" in chosen[0], lines
        made = [line for line in lines if "engine on cpu made" in line]
        rails = "(lo; transports uv; channels basic; authenticated)"
        assert len(made) == 1 and "127.0.0.1:" in made[0] and rails in made[0], lines


def test_staging_too_small_for_one_slice_is_rejected_at_init() -> None:
    env = {"FAIRRING_TOTAL_MEMORY": "1MiB", "FAIRRING_SLICE_SIZE": "4MiB"}
    outcomes = expect_init_failure(Layout(2, 2), {r: env for r in range(4)})
    for outcome in outcomes.values():
        assert "FAIRRING_TOTAL_MEMORY=1MiB cannot hold one slice in flight" in outcome, outcome
        # 2 ranks per machine: every local rank's 2 MiB part of the slot, 2 MiB of shards, and
        # the 4 MiB padded copy a last slice may need.
        assert "a slice needs 10MiB of staging" in outcome, outcome
