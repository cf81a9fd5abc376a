"""c10d's reconfigure contract on fairring groups: members set and replaced by reconfigure(), checked as any group is.

torch >= 2.15: init_process_group(enable_reconfigure=True) makes the group;
`_get_reconfigure_handle` and `_reconfigure` are c10d's own entry points.
All-reduces after each reconfigure are checked against plain torch sums of
the members' inputs.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import fairring
from benchmarks.harness import COLLECTIVE_TIMEOUT, InitSpec, Layout, RankFailure, RankPool
from benchmarks.reference import assert_matches, rank_tensor, reduce_reference

pytestmark = pytest.mark.skipif(
    not hasattr(c10d, "_reconfigure"),
    reason=f"torch {torch.__version__} has no reconfigure contract (torch >= 2.15 has)",
)

SHAPE = (1 << 15,)


def init_reconfigurable(spec: InitSpec, rank: int, world_size: int, store_port: int) -> None:
    import fairring  # noqa: F401  (registers the backend)

    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=COLLECTIVE_TIMEOUT)
    dist.init_process_group(
        "fairring", store=store, rank=rank, world_size=world_size, timeout=spec.timeout, enable_reconfigure=True
    )


def checked_all_reduce(members: list[int], me: int, seed: int) -> dict[str, object]:
    """An all-reduce of every member's input (members by their first ranks), against torch's sum."""
    tensor = rank_tensor(me, SHAPE, torch.float32, seed=seed)
    dist.all_reduce(tensor)
    expected = reduce_reference([rank_tensor(member, SHAPE, torch.float32, seed=seed) for member in members], "sum")
    assert_matches(tensor, expected)
    stats = fairring.backend_of().engine_stats("cpu")
    return {"rank": dist.get_rank(), "size": dist.get_world_size(), "on_engine": stats is not None and stats["ops"] > 0}


def exchange(store: dist.Store, round_name: str, members: list[int], me: int) -> list[str]:
    """Every member's current handle, by first rank, through the store (the out-of-band exchange)."""
    store.set(f"test/{round_name}/{me}", c10d._get_reconfigure_handle())
    return [store.get(f"test/{round_name}/{member}").decode() for member in members]


def error_of(call: object) -> str:
    try:
        call()  # type: ignore[operator]
    except (RuntimeError, ValueError) as error:
        return str(error)
    return "no error"


def three_members_then_two(leaves: str) -> dict[str, object]:
    """Three members; then rank 2 leaves ("destroy") or dies ("kill"), and the others reconfigure without it."""
    me = dist.get_rank()  # as made; reconfigure then renumbers
    store = c10d._get_default_store()
    outcome: dict[str, object] = {"before": error_of(lambda: dist.all_reduce(torch.ones(4)))}
    first = exchange(store, "first", [0, 1, 2], me)
    c10d._reconfigure(uuid=1, handles=first).wait()
    outcome["three"] = checked_all_reduce([0, 1, 2], me, seed=1)
    if me == 2:
        if leaves == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        dist.destroy_process_group()  # it leaves; the others go on without it
        return outcome
    if leaves == "kill":
        outcome["failure"] = error_of(lambda: dist.all_reduce(torch.ones(1 << 12)))
    second = exchange(store, "second", [0, 1], me)
    outcome["stale"] = error_of(lambda: c10d._reconfigure(uuid=2, handles=first[:2]))
    # A set: the backend orders the members (by handle).
    c10d._reconfigure(uuid=2, handles=set(second)).wait()
    outcome["expected_rank"] = sorted(second).index(second[me])
    outcome["two"] = checked_all_reduce([0, 1], me, seed=2)
    third = exchange(store, "third", [0, 1], me)
    outcome["reused"] = error_of(lambda: c10d._reconfigure(uuid=1, handles=third))
    outcome["still_two"] = checked_all_reduce([0, 1], me, seed=3)
    outcome["error"] = dist.group.WORLD._get_backend(torch.device("cpu")).get_error()
    dist.destroy_process_group()
    return outcome


@pytest.mark.timeout(120)
@pytest.mark.parametrize("leaves", ["destroy", "kill"])
def test_reconfigure_sets_and_replaces_the_members(leaves: str) -> None:
    ranks = RankPool(Layout(3, 1), InitSpec(timeout=timedelta(seconds=10))).start(init=False)
    try:
        ranks.run_per_rank(init_reconfigurable, ranks.init_args)
        if leaves == "destroy":
            outcomes = dict(enumerate(ranks.run(three_members_then_two, leaves, timeout=90)))
        else:
            with pytest.raises(RankFailure) as failure:
                ranks.run(three_members_then_two, leaves, timeout=90)
            outcomes = failure.value.results
            assert set(outcomes) == {0, 1}, failure.value
    finally:
        ranks.close()
    for me, outcome in sorted(outcomes.items()):
        print(f"rank {me}: {outcome}")
        if leaves == "kill":
            assert "rank 2 (machine 2 of 3) exited, crashed or lost its network" in str(outcome["failure"]), outcome
        assert "has no members yet; call torch.distributed._reconfigure" in str(outcome["before"]), outcome
        # Three machines of one rank: regular, on the engine.
        assert outcome["three"] == {"rank": me, "size": 3, "on_engine": True}, outcome
        if me == 2:
            continue
        assert "is not among the 2 given" in str(outcome["stale"]) and "stale" in str(outcome["stale"]), outcome
        assert outcome["two"] == {"rank": outcome["expected_rank"], "size": 2, "on_engine": True}, outcome
        assert "uuid 1 was used before" in str(outcome["reused"]), outcome
        # A refused reconfigure changes nothing.
        assert outcome["still_two"] == outcome["two"], outcome
        assert outcome["error"] == torch._C._distributed_c10d.ErrorType.SUCCESS, outcome
