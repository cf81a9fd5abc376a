"""Shutdown, abort, group churn and completion callbacks: everything returns, and nothing is left behind."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import InitSpec, Layout, RankPool
from benchmarks.reference import all_ranks_reduced, assert_matches, rank_tensor
from nixl_support import RAILS_TRANSPORTS, rails_env
from scenarios import assert_resources_settled, make_engine, resources_after_a_cycle, timed_stop


def stop_with_a_local_step_blocked(how: str) -> tuple[float, str]:
    """Rank 3 stays away, so rank 2 blocks in a local step (Gloo, which cannot abort) and ranks 0 and 1
    in theirs or on the rails; then each stops its group by `how` ("destroy" or "abort").

    Returns how long that took and the error the op's wait() raised.
    """
    make_engine("cpu")
    if dist.get_rank() == 3:
        time.sleep(4)
        dist.destroy_process_group()
        return 0.0, ""
    work = dist.all_reduce(torch.ones(1 << 16), async_op=True)
    time.sleep(1)
    world = dist.group.WORLD
    return timed_stop(work, dist.destroy_process_group if how == "destroy" else world.abort)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["destroy", "abort"])
def test_stopping_returns_while_a_local_step_is_blocked(how: str) -> None:
    with RankPool(Layout(2, 2)) as ranks:
        outcomes = ranks.run(stop_with_a_local_step_blocked, how, timeout=90)
    did = "shut down its process group" if how == "destroy" else "aborted its process group"
    for rank, (elapsed, error) in enumerate(outcomes[:3]):
        assert elapsed < 2, (rank, elapsed)
        # Each rank stops its own group at about the same time: the first to say so is named.
        assert did in error and "(machine " in error, (rank, error)


def stop_when_nothing_is_pending(how: str) -> str:
    """The engine made and idle, then the group stopped by `how`: how the engine stopped its local steps."""
    import fairring

    backend = fairring.backend_of()
    make_engine("cpu")
    dist.barrier()
    world = dist.group.WORLD
    if how == "abort":
        world.abort()
    else:
        world.shutdown()
    return backend.engine_stats("cpu")["local_steps_state"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("how", "state"), [("shutdown", "closed"), ("abort", "aborted")])
def test_shutdown_closes_the_local_groups_and_abort_aborts_them(how: str, state: str) -> None:
    """A normal end drains the device and shuts the local groups down in good order; abort() aborts them at
    once, even with nothing pending (docs/design.md, "Leaving in good order")."""
    with RankPool(Layout(2, 2)) as ranks:
        assert ranks.run(stop_when_nothing_is_pending, how) == [state] * 4


def churn_groups(cycles: int) -> list[tuple[int, int, int]]:
    """Makes a group, runs engine all-reduces on it, destroys it; `cycles` times. Resources after each."""
    shape = (1 << 16,)
    expected = all_ranks_reduced(shape, torch.float32)
    after: list[tuple[int, int, int]] = []
    for _ in range(cycles):
        group = dist.new_group(backend="fairring")
        for _ in range(3):
            tensor = rank_tensor(dist.get_rank(), shape, torch.float32)
            dist.all_reduce(tensor, group=group)
            assert_matches(tensor, expected)
        dist.destroy_process_group(group)
        time.sleep(0.1)  # threads that were told to leave finish leaving
        after.append(resources_after_a_cycle(after))
    return after


# CI churns NIXL groups 5 times; `make test-nixl` 20 times, as for TensorPipe.
NIXL_CYCLES = 20 if os.environ.get("FAIRRING_TEST_NIXL_FULL") == "1" else 5


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", RAILS_TRANSPORTS)
def test_making_and_destroying_groups_leaves_threads_descriptors_and_memory_where_they_were(transport: str) -> None:
    cycles = 20 if transport == "tensorpipe" else NIXL_CYCLES
    with RankPool(Layout(2, 2), InitSpec(extra_env=rails_env(transport))) as ranks:
        by_rank = ranks.run(churn_groups, cycles, timeout=200)
    assert_resources_settled(by_rank)


def nested_all_reduce_in_a_callback() -> None:
    """A completion callback issues a second all-reduce and waits for it: it must not deadlock the engine."""
    shape = (1 << 14,)
    first = rank_tensor(dist.get_rank(), shape, torch.float32)
    second = rank_tensor(dist.get_rank(), shape, torch.float32, seed=7)

    def then_reduce_second(done: torch.futures.Future) -> torch.Tensor:
        done.value()
        dist.all_reduce(second)  # blocks this callback until the second op completes
        return second

    chained = dist.all_reduce(first, async_op=True).get_future().then(then_reduce_second)
    chained.wait()
    assert_matches(first, all_ranks_reduced(shape, torch.float32))
    assert_matches(second, all_ranks_reduced(shape, torch.float32, seed=7))


@pytest.mark.timeout(120)
def test_a_callback_may_issue_and_wait_for_another_all_reduce() -> None:
    with RankPool(Layout(2, 2)) as ranks:
        ranks.run(nested_all_reduce_in_a_callback, timeout=60)


def thread_names_with_an_engine() -> dict[str, int]:
    """This rank's threads by name, once its engine is made and has run an all-reduce."""
    from benchmarks.rank_threads import thread_names

    tensor = rank_tensor(dist.get_rank(), (100_000,), torch.float32)
    dist.all_reduce(tensor)
    assert_matches(tensor, all_ranks_reduced((100_000,), torch.float32))
    return thread_names()


@pytest.mark.timeout(120)
def test_fairrings_threads_are_named() -> None:
    """An operator tells fairring's threads from torch's and the transports' (top -H, py-spy, gdb):
    the engine's stages, watchdog and completion workers, each named fr-..."""
    with RankPool(Layout(2, 2), InitSpec(extra_env={"FAIRRING_FLAT_THRESHOLD": "0"})) as ranks:
        for names in ranks.run(thread_names_with_an_engine):
            for name in ("fr-rs-stage", "fr-reduce-stage", "fr-ag-stage", "fr-watchdog", "fr-completion"):
                assert name in names, names
