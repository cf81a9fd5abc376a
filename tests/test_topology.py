"""Machine grouping and the C++ Topology: pure, no processes."""

from __future__ import annotations

import pytest

from fairring import _C
from fairring._config import Config, ConfigError
from fairring._topology import (
    RankIdentity,
    check_settings_agree,
    group_into_machines,
    host_identity,
    identify_self,
)


def explicit(*machine_ids: str, local_ranks: list[int | None] | None = None) -> list[RankIdentity]:
    local_ranks = local_ranks or [None] * len(machine_ids)
    return [RankIdentity(m, "FAIRRING_MACHINE_ID", lr) for m, lr in zip(machine_ids, local_ranks, strict=True)]


def test_machine_major_order() -> None:
    assert group_into_machines(explicit("a", "a", "b", "b")) == [[0, 1], [2, 3]]


def test_interleaved_order_orders_machines_by_lowest_rank() -> None:
    assert group_into_machines(explicit("x", "y", "z", "x", "y", "z")) == [[0, 3], [1, 4], [2, 5]]


def test_local_rank_orders_ranks_within_a_machine() -> None:
    identities = explicit("a", "a", "b", "b", local_ranks=[1, 0, 0, 1])
    assert group_into_machines(identities) == [[1, 0], [2, 3]]


def test_single_machine_and_single_rank() -> None:
    assert group_into_machines(explicit("only", "only", "only")) == [[0, 1, 2]]
    assert group_into_machines(explicit("solo")) == [[0]]


def test_irregular_deployment_is_grouped_as_it_is() -> None:
    # Machines of different sizes: served by the flat path, never rejected.
    assert group_into_machines(explicit("a", "a", "a", "b")) == [[0, 1, 2], [3]]


def test_repeated_local_rank_keeps_a_deterministic_order() -> None:
    assert group_into_machines(explicit("a", "a", local_ranks=[0, 0])) == [[0, 1]]
    assert group_into_machines(explicit("a", "a", "a", local_ranks=[1, 0, 1])) == [[1, 0, 2]]


def test_mixed_identification_groups_by_host(caplog: pytest.LogCaptureFixture) -> None:
    identities = [
        RankIdentity("a", "FAIRRING_MACHINE_ID", host="h1"),
        RankIdentity("torchrun node 0", "torchrun's GROUP_RANK", host="h1"),
        RankIdentity("torchrun node 1", "torchrun's GROUP_RANK", host="h2"),
    ]
    with caplog.at_level("WARNING", logger="fairring"):
        assert group_into_machines(identities) == [[0, 1], [2]]
    assert "identify their machine in different ways" in caplog.text and "FAIRRING_MACHINE_ID" in caplog.text


def test_identify_self_precedence() -> None:
    torchrun = {"GROUP_RANK": "3", "LOCAL_RANK": "1"}
    host = host_identity()
    assert identify_self(Config(machine_id="m7"), torchrun) == RankIdentity("m7", "FAIRRING_MACHINE_ID", 1, host)
    assert identify_self(Config(), torchrun) == RankIdentity("torchrun node 3", "torchrun's GROUP_RANK", 1, host)
    assert identify_self(Config(), {}) == RankIdentity(host, "host discovery", None, host)


def test_malformed_launcher_variable() -> None:
    with pytest.raises(ConfigError, match="LOCAL_RANK='x' is not an integer"):
        identify_self(Config(), {"LOCAL_RANK": "x"})


def test_host_identity_includes_namespaces() -> None:
    identity = host_identity()
    # Containers sharing a kernel differ in these; the boot id alone would merge them.
    assert "net:[" in identity and "ipc:[" in identity and "pid:[" in identity


def test_settings_agreement() -> None:
    check_settings_agree([{"FAIRRING_SLICE_SIZE": 1}, {"FAIRRING_SLICE_SIZE": 1}])
    with pytest.raises(ConfigError, match=r"FAIRRING_SLICE_SIZE differs across ranks \(\{0: 1, 1: 2\}\)"):
        check_settings_agree([{"FAIRRING_SLICE_SIZE": 1}, {"FAIRRING_SLICE_SIZE": 2}])


def test_cpp_topology_derives_rails() -> None:
    topology = _C.Topology(4, [[0, 3], [1, 4], [2, 5]])
    assert (topology.world_size, topology.num_machines, topology.local_size) == (6, 3, 2)
    assert (topology.machine, topology.local_rank) == (1, 1)
    assert topology.local_ranks == [1, 4]
    assert topology.rail_peers == [3, 4, 5]
    assert topology.regular and topology.serves_engine


def test_cpp_topology_takes_irregular_layouts_without_rails() -> None:
    topology = _C.Topology(2, [[0, 1], [2]])
    assert (topology.world_size, topology.num_machines, topology.local_size) == (3, 2, 1)
    assert not topology.regular and not topology.serves_engine and topology.rail_peers == []
    assert "irregular" in repr(topology)
    assert not _C.Topology(0, [[0, 1]]).serves_engine  # one machine: nothing to send


@pytest.mark.parametrize(
    ("rank", "machines", "message"),
    [
        (0, [[0, 1], []], "machine 1 of the topology is empty"),
        (0, [[0, 1], [1, 2]], "appears twice"),
        (7, [[0], [1]], "missing from topology"),
        (0, [[0], [2]], "are not 0..1"),
        (0, [], "needs a machine"),
    ],
)
def test_cpp_topology_rejects_bad_layouts(rank: int, machines: list[list[int]], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        _C.Topology(rank, machines)


def test_cpp_topology_from_one_rank_s_view_matches_the_whole_layout() -> None:
    machines = [[0, 3], [1, 4], [2, 5]]
    for rank in range(6):
        whole = _C.Topology(rank, machines)
        machine = next(m for m, ranks in enumerate(machines) if rank in ranks)
        peers = [ranks[machines[machine].index(rank)] for ranks in machines]
        view = _C.Topology(rank, 6, machine, machines[machine], peers, [2, 2, 2])
        for attribute in ("world_size", "num_machines", "machine", "local_rank", "local_ranks", "rail_peers"):
            assert getattr(view, attribute) == getattr(whole, attribute), attribute
        # A rank knows where its machine's ranks and its rail peers are, and no more.
        for other in range(6):
            known = other in machines[machine] or other in peers
            expected = next(m for m, ranks in enumerate(machines) if other in ranks) if known else -1
            assert view.machine_of(other) == whole.machine_of(other) == expected


@pytest.mark.parametrize(
    ("view", "message"),
    [
        ((0, 3, 0, [0, 1], [0, 2], [2, 1]), "expected a rail peer per machine of a regular group, and none otherwise"),
        ((0, 4, 0, [0, 1], [0], [2, 2]), "expected a rail peer per machine"),
        ((0, 4, 0, [0, 1], [1, 2], [2, 2]), "rail peer 1 on machine 0 is not a distinct rank"),
        ((0, 4, 0, [0, 1], [0, 1], [2, 2]), "rail peer 1 on machine 1 is not a distinct rank"),
        ((0, 4, 0, [1, 2], [0, 3], [2, 2]), "rank 0 is not among its machine's ranks"),
        ((0, 4, 0, [0, 1, 2], [0, 3], [2, 2]), "machine 0 holds 2 ranks but 3 were given"),
        ((0, 5, 0, [0, 1], [0, 3], [2, 2]), "do not add up to the group's 5 ranks"),
        ((0, 4, 2, [0, 1], [0, 3], [2, 2]), "machine 2 is not one of 2"),
        ((4, 4, 0, [0, 4], [4, 3], [2, 2]), "rank 4 is not in a group of 4"),
        ((0, 4, 0, [0, 0], [0, 3], [2, 2]), "local rank 0 is repeated"),
    ],
)
def test_cpp_topology_rejects_inconsistent_views(view: tuple[object, ...], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        _C.Topology(*view)
