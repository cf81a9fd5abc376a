"""Failures in the engine complete the pending work with an error; nothing hangs."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from harness import Layout, RankFailure, RankPool
from scenarios import make_engine


def die_or_reduce(victim: int) -> dict[str, object]:
    """The victim exits abruptly; the others all-reduce and report what happened."""
    make_engine("cpu")  # the failure under test is the engine's, not its creation's
    if dist.get_rank() == victim:
        os._exit(17)
    time.sleep(0.5)  # usually the victim is gone first; either order must work
    start = time.monotonic()
    outcome: dict[str, object] = {}
    try:
        dist.all_reduce(torch.ones(4096))
        outcome["first"] = "completed"
    except RuntimeError as error:
        outcome["first"] = str(error)
    try:
        dist.all_reduce(torch.ones(4096))
        outcome["later"] = "completed"
    except RuntimeError as error:
        outcome["later"] = str(error)
    outcome["seconds"] = time.monotonic() - start
    return outcome


@pytest.mark.timeout(180)
def test_dead_rail_peer_fails_pending_and_later_ops_naming_it() -> None:
    ranks = RankPool(Layout(2, 1)).start()
    try:
        with pytest.raises(RankFailure) as failure:
            ranks.run(die_or_reduce, 1, timeout=120)
    finally:
        ranks.close()
    assert "exit" in failure.value.outcomes[1]
    outcome = failure.value.results[0]
    assert "rail peer rank 1" in outcome["first"] and "op #" in outcome["first"], outcome
    assert "earlier failure stopped the engine" in outcome["later"], outcome
    assert outcome["seconds"] < 30, outcome


def late_peer_and_bounded_wait() -> str:
    """Rank 1 issues its all-reduce 3 s late; rank 0 waits 0.5 s, then for good."""
    from datetime import timedelta

    tensor = torch.full((4096,), float(dist.get_rank() + 1))
    # Made first: the first all-reduce returns only once every rank has reached it (as NCCL's does).
    make_engine("cpu")
    if dist.get_rank() == 1:
        time.sleep(3)
    work = dist.all_reduce(tensor, async_op=True)
    message = ""
    if dist.get_rank() == 0:
        try:
            work.wait(timeout=timedelta(milliseconds=500))
            message = "returned early"
        except RuntimeError as error:
            message = str(error)
    work.wait()
    assert torch.all(tensor == 3), tensor[:4]
    return message


@pytest.mark.timeout(120)
def test_wait_with_timeout_raises_then_the_op_still_completes() -> None:
    with RankPool(Layout(2, 1)) as ranks:
        messages = ranks.run(late_peer_and_bounded_wait)
    assert "all_reduce did not complete within 500 ms" in messages[0], messages


def mismatched_all_reduce(difference: str) -> str:
    rank = dist.get_rank()
    numel = 8192 if (difference == "size" and rank == 1) else 4096
    dtype = torch.int32 if (difference == "dtype" and rank == 1) else torch.float32
    op = dist.ReduceOp.MAX if (difference == "op" and rank == 1) else dist.ReduceOp.SUM
    try:
        dist.all_reduce(torch.ones(numel, dtype=dtype), op=op)
    except RuntimeError as error:
        return str(error)
    return "completed"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("difference", ["size", "dtype", "op"])
def test_ranks_issuing_different_all_reduces_fail_instead_of_mixing_data(difference: str) -> None:
    with RankPool(Layout(2, 1)) as ranks:
        messages = ranks.run(mismatched_all_reduce, difference, timeout=90)
    for message in messages:
        assert "the ranks issued different all-reduces" in message or "rail peer rank" in message, messages
    assert any("the ranks issued different all-reduces" in message for message in messages), messages
