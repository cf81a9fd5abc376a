"""shrink_group on fairring groups: the survivors get a working group without the excluded ranks.

Faults are real (SIGKILL, SIGSTOP); the new group is made by the survivors
alone, and its all-reduce is checked against a plain torch sum of the
survivors' inputs. get_error() is checked against the cause fairring named.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import SHRINK_ABORT, SHRINK_DEFAULT

import fairring
from benchmarks.harness import InitSpec, Layout, RankFailure, RankPool
from benchmarks.reference import assert_matches, rank_tensor, reduce_reference
from scenarios import assert_resources_settled, resources_after_a_cycle

ErrorType = torch._C._distributed_c10d.ErrorType

pytestmark = pytest.mark.skipif(
    not hasattr(torch._C._distributed_c10d.Backend, "get_error"),
    reason=f"torch {torch.__version__} has no Backend.get_error (torch >= 2.15 has)",
)

# Short, so that timeouts show within a test's time; shorter still for a shrink some survivor never joins.
FAULT_TIMEOUT = timedelta(seconds=10)
SHRINK_TIMEOUT = timedelta(seconds=5)
SHAPE = (1 << 16,)


def error_of(group: dist.ProcessGroup | None) -> ErrorType:
    """c10d's get_error() of the group's backend, as torch's own fault-tolerance code asks it."""
    assert group is not None
    return group._get_backend(torch.device("cpu")).get_error()


def check_shrunk_group(group: dist.ProcessGroup, survivors: list[int], old_rank: int) -> dict[str, object]:
    """An all-reduce against the survivors' sum, an all-gather of old ranks, a reduce-scatter (FSDP's) against
    the survivors' sum, and where the all-reduce ran."""
    tensor = rank_tensor(old_rank, SHAPE, torch.float32, seed=1)
    dist.all_reduce(tensor, group=group)
    assert_matches(
        tensor, reduce_reference([rank_tensor(rank, SHAPE, torch.float32, seed=1) for rank in survivors], "sum")
    )
    gathered = [torch.empty(1) for _ in survivors]
    dist.all_gather(gathered, torch.tensor([float(old_rank)]), group=group)
    count = len(survivors)
    scattered = torch.empty(1001)
    dist.reduce_scatter_tensor(scattered, rank_tensor(old_rank, (count * 1001,), torch.float32, seed=2), group=group)
    every = [rank_tensor(rank, (count * 1001,), torch.float32, seed=2) for rank in survivors]
    assert_matches(scattered, reduce_reference(every, "sum").view(count, 1001)[group.rank()])
    stats = fairring.backend_of(group).engine_stats("cpu")
    return {
        "rank": group.rank(),
        "size": group.size(),
        "gathered": [int(value.item()) for value in gathered],
        "on_engine": stats is not None and stats["ops"] > 0,
        "error_after": error_of(group),
    }


def lose_ranks_then_shrink(excluded: list[int], fault: str, scratch: str) -> dict[str, object]:
    """The excluded ranks leave ("none"), die ("kill") or freeze ("stop"); the others shrink the world group.

    "kill": the survivors see the failure first, then shrink. "stop": they
    shrink with SHRINK_ABORT while an all-reduce waits on the frozen rank, and
    report how long that all-reduce took to fail.
    """
    rank, size = dist.get_rank(), dist.get_world_size()
    survivors = [r for r in range(size) if r not in excluded]
    folder = Path(scratch)
    tensor = rank_tensor(rank, SHAPE, torch.float32)
    dist.all_reduce(tensor)  # the engine is made, and has run
    world = dist.group.WORLD
    if rank in excluded:
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "stop":
            (folder / f"frozen{rank}").write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
        dist.destroy_process_group()
        return {"left": True}
    outcome: dict[str, object] = {"error_before": error_of(world)}
    flags = SHRINK_DEFAULT
    in_flight = None
    if fault == "kill":
        try:
            dist.all_reduce(tensor)
            outcome["failure"] = "completed"
        except RuntimeError as error:
            outcome["failure"] = str(error)
        outcome["error_type"] = error_of(world)
    elif fault == "stop":
        while not all((folder / f"frozen{r}").exists() for r in excluded):
            time.sleep(0.05)
        in_flight = dist.all_reduce(tensor, async_op=True)
        time.sleep(0.5)  # it is under way, waiting for the frozen rank
        flags = SHRINK_ABORT
    started = time.monotonic()
    group = dist.shrink_group(excluded, shrink_flags=flags)
    outcome["shrink_s"] = time.monotonic() - started
    if in_flight is not None:
        try:
            in_flight.wait()
            outcome["in_flight"] = "completed"
        except RuntimeError as error:
            outcome["in_flight"] = str(error)
        outcome["in_flight_s"] = time.monotonic() - started
    outcome.update(check_shrunk_group(group, survivors, rank))
    outcome["world_is_shrunk"] = dist.get_world_size() == len(survivors)
    (folder / f"done{rank}").write_text("")
    if fault == "stop" and rank == survivors[0]:
        # Every survivor is done with it: the frozen ranks may go.
        while not all((folder / f"done{r}").exists() for r in survivors):
            time.sleep(0.05)
        for r in excluded:
            os.kill(int((folder / f"frozen{r}").read_text()), signal.SIGKILL)
    dist.destroy_process_group()
    return outcome


def shrink_outcomes(layout: Layout, excluded: list[int], fault: str, tmp_path: Path) -> dict[int, dict[str, object]]:
    with RankPool(layout, InitSpec(timeout=FAULT_TIMEOUT)) as ranks:
        if fault == "none":
            return dict(enumerate(ranks.run(lose_ranks_then_shrink, excluded, fault, str(tmp_path), timeout=90)))
        with pytest.raises(RankFailure) as failure:
            ranks.run(lose_ranks_then_shrink, excluded, fault, str(tmp_path), timeout=90)
    survivors = set(range(layout.world_size)) - set(excluded)
    assert set(failure.value.results) == survivors, failure.value
    return failure.value.results


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("layout", "excluded", "fault", "on_engine"),
    [
        # A whole machine goes: 2 x 1 remain, regular, on the engine.
        (Layout(3, 1), [2], "none", True),
        # A machine loses one of its ranks: 2 + 1 remain, irregular, on Gloo.
        (Layout(2, 2), [3], "none", False),
        (Layout(2, 2), [3], "kill", False),
        # The frozen rank is in the middle: the survivors' ranks are renumbered.
        (Layout(3, 1), [1], "stop", True),
    ],
    ids=["machine-gone", "rank-left", "rank-killed", "rank-frozen-abort"],
)
def test_survivors_shrink_to_a_working_group(
    layout: Layout, excluded: list[int], fault: str, on_engine: bool, tmp_path: Path
) -> None:
    outcomes = shrink_outcomes(layout, excluded, fault, tmp_path)
    survivors = [rank for rank in range(layout.world_size) if rank not in excluded]
    for old_rank in survivors:
        outcome = outcomes[old_rank]
        print(f"rank {old_rank}: {outcome}")
        assert outcome["error_before"] == ErrorType.SUCCESS, outcome
        assert outcome["rank"] == survivors.index(old_rank) and outcome["size"] == len(survivors), outcome
        assert outcome["world_is_shrunk"], outcome
        assert outcome["gathered"] == survivors, outcome
        assert outcome["on_engine"] == on_engine, outcome
        assert outcome["error_after"] == ErrorType.SUCCESS, outcome
        if fault == "kill":
            assert "rank 3 (machine 1 of 2) exited, crashed or lost its network" in str(outcome["failure"]), outcome
            # Seen first hand (its connection broke), or named by a neighbour that saw it first.
            assert outcome["error_type"] in (ErrorType.COMM_ERROR, ErrorType.REMOTE_ERROR), outcome
        if fault == "stop":
            # Ended by the shrink, long before the group's timeout.
            assert "SHRINK_ABORT" in str(outcome["in_flight"]), outcome
            assert float(outcome["in_flight_s"]) < FAULT_TIMEOUT.total_seconds() / 2, outcome


def bad_shrinks() -> list[str]:
    """Direct calls of the backend's shrink with what c10d's shrink_group would also refuse."""
    backend = fairring.backend_of(dist.group.WORLD)
    messages = []
    for excluded in ([], [0, 1], [5], [-1], [1, 1], [dist.get_rank()]):
        try:
            backend.shrink(excluded, SHRINK_DEFAULT, None)
            messages.append(f"{excluded}: shrank")
        except ValueError as error:
            messages.append(f"{excluded}: {error}")
    try:
        backend.shrink([1 - dist.get_rank()], 7, None)
    except ValueError as error:
        messages.append(str(error))
    # The group still works: nothing was torn down by the refusals.
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    messages.append(f"sum {tensor[0].item()}")
    return messages


@pytest.mark.timeout(60)
def test_bad_shrinks_are_refused_before_anything_changes() -> None:
    with RankPool(Layout(2, 1)) as ranks:
        by_rank = ranks.run(bad_shrinks)
    for rank, messages in enumerate(by_rank):
        text = "\n".join(messages)
        print(text)
        assert "[]: fairring: shrink needs at least one rank to exclude" in text, text
        assert "[0, 1]: fairring: cannot exclude all 2 ranks of the group: at least one must remain" in text, text
        assert "[5]: fairring: cannot exclude rank 5: the group has ranks 0 to 1" in text, text
        assert "[-1]: fairring: cannot exclude rank -1" in text, text
        assert "[1, 1]: fairring: rank 1 is excluded twice" in text or rank == 1, text
        assert f"[{rank}]: fairring: rank {rank} excludes itself" in text, text
        assert "shrink_flags must be SHRINK_DEFAULT (0) or SHRINK_ABORT (1), not 7" in text, text
        assert "shrank" not in text.replace("shrank its", ""), text
        assert messages[-1] == "sum 2.0", messages


def shrink_without(excluded: list[int], absent: int, how: str) -> str:
    """The ranks but `excluded` and `absent` shrink; `absent` never does: it dies ("killed") or idles ("idle")."""
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(16))
    if rank in excluded:
        dist.destroy_process_group()
        return "left"
    if rank == absent:
        if how == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(SHRINK_TIMEOUT.total_seconds() + 5)
        return "idle"
    started = time.monotonic()
    try:
        dist.shrink_group(excluded)
        return "shrank"
    except RuntimeError as error:
        return f"after {time.monotonic() - started:.1f} s: {error}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["idle", "killed"])
def test_a_survivor_that_does_not_shrink_is_named_after_the_timeout(how: str) -> None:
    """Rank 3 leaves; rank 2 never joins the shrink (a bug, or a second failure): 0 and 1 name it."""
    with RankPool(Layout(2, 2), InitSpec(timeout=SHRINK_TIMEOUT)) as ranks:
        if how == "idle":
            outcomes = dict(enumerate(ranks.run(shrink_without, [3], 2, how, timeout=90)))
        else:
            with pytest.raises(RankFailure) as failure:
                ranks.run(shrink_without, [3], 2, how, timeout=90)
            outcomes = failure.value.results
    for rank in (0, 1):
        message = outcomes[rank]
        print(f"rank {rank}: {message}")
        assert f"rank {rank} shrank its group of 4 without rank(s) [3], but rank(s) [2] did not" in message, message
        seconds = float(message.split()[1])
        assert SHRINK_TIMEOUT.total_seconds() - 1 < seconds < SHRINK_TIMEOUT.total_seconds() + 5, message


def churn_shrunk_groups(cycles: int) -> list[tuple[int, int, int]]:
    """Each cycle: a group of all ranks, shrunk without the last, used, destroyed; resources after each."""
    rank, size = dist.get_rank(), dist.get_world_size()
    survivors = list(range(size - 1))
    after = []
    for _ in range(cycles):
        group = dist.new_group(backend="fairring")
        dist.all_reduce(rank_tensor(rank, SHAPE, torch.float32), group=group)  # its engine is made
        if rank == size - 1:
            dist.destroy_process_group(group)
            # torch numbers groups by counting them on each rank; the shrink
            # counted one on the survivors. An excluded rank of a real job
            # leaves it; this one stays for the next cycle, so it counts too.
            dist.distributed_c10d._world.group_count += 1
        else:
            shrunk = dist.shrink_group([size - 1], group=group)
            check_shrunk_group(shrunk, survivors, rank)
            dist.destroy_process_group(shrunk)
        dist.barrier()  # the next cycle's group is made by every rank
        time.sleep(0.1)  # threads that were told to leave finish leaving
        after.append(resources_after_a_cycle(after))
    return after


@pytest.mark.timeout(240)
def test_shrinking_releases_the_old_groups_threads_descriptors_and_memory() -> None:
    with RankPool(Layout(3, 1)) as ranks:
        by_rank = ranks.run(churn_shrunk_groups, 12, timeout=200)
    assert_resources_settled(by_rank)
