"""Synchronous and asynchronous collectives of every kind, on the engine and the delegate.

Since torch 2.8 ProcessGroupNCCL returns no Work for a synchronous operation (`async_op=False`) and
queues its kernel on the caller's stream (docs/design.md, "ProcessGroupNCCL's contract"). Gloo always
returns one, so CPU jobs never meet that; the emulated device's delegate keeps NCCL's contract
(`nccl_delegate`, csrc/device/nccl_delegate_model.h), so that a path of fairring's that needs the
delegate's Work where NCCL gives none fails here as it would on a GPU. Every result is checked against
torch's from every rank's input; tests/test_cuda.py runs the same on real NCCL.

Negative control: with fairring no longer asking its delegates for a Work, a synchronous all-reduce
below the threshold, launched in its turn behind the engine, fails.

The model also coalesces as NCCL does (one block for the group, whichever thread issues) and refuses a
second thread inside it: a native coalescing block opened while a delegated op waits for its turn must
not take that op in (its negative control lets the block open without waiting, and the op, launched on
a stage thread into the open block, is refused).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import InitSpec, Layout, RankPool
from benchmarks.reference import all_ranks_reduced, assert_matches, rank_tensor
from nixl_support import rails_env
from scenarios import ABOVE_64KIB, BELOW_64KIB, assert_every_kind_on_both_paths, every_kind_both_ways

# Above it (ABOVE_64KIB) the engine takes all-reduces, reduce-scatters and all-gathers; below, the delegate.
THRESHOLD = "64KiB"


def nccl_contract(seed: int, device: str = "") -> InitSpec:
    return InitSpec(
        extra_env={
            "FAIRRING_SHM_DISABLE": "1",
            "FAIRRING_SLICE_SIZE": "16KiB",
            "FAIRRING_FLAT_THRESHOLD": THRESHOLD,
            "FAIRRING_TEST_EMULATED_DEVICE": f"seed={seed},nccl_delegate{device}",
            **rails_env("tensorpipe"),
        },
        timeout=timedelta(seconds=60),
    )


@pytest.mark.timeout(180)
def test_every_kind_synchronous_or_not_against_nccls_contract() -> None:
    with RankPool(Layout(2, 2), nccl_contract(seed=21)) as ranks:
        outcomes = ranks.run(every_kind_both_ways, "cpu", timeout=150)
    assert_every_kind_on_both_paths(outcomes, "gloo")


def synchronous_all_reduce_in_turn(asked: bool) -> str:
    """An engine all-reduce in flight, then a synchronous one below the threshold, which takes its turn
    in the engine's launch order; checked. What the second raised, if anything."""
    from fairring import _C

    _C._testing.set_delegates_asked_for_work(asked)
    rank = dist.get_rank()
    big = rank_tensor(rank, (ABOVE_64KIB,), torch.float32, 1)
    small = rank_tensor(rank, (BELOW_64KIB,), torch.float32, 2)
    work = dist.all_reduce(big, async_op=True)
    try:
        dist.all_reduce(small)
    except Exception as error:  # the negative control's outcome, reported
        work.wait()
        return str(error)
    work.wait()
    assert_matches(big, all_ranks_reduced((ABOVE_64KIB,), torch.float32, seed=1))
    assert_matches(small, all_ranks_reduced((BELOW_64KIB,), torch.float32, seed=2))
    return "no error"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("asked", [True, False], ids=["asking_for_work", "negative_control"])
def test_a_synchronous_all_reduce_in_turn_gets_a_work(asked: bool) -> None:
    with RankPool(Layout(2, 2), nccl_contract(seed=22)) as ranks:
        outcomes = ranks.run(synchronous_all_reduce_in_turn, asked, timeout=120)
    for outcome in outcomes:
        if asked:
            assert outcome == "no error", outcome
        else:
            assert "the delegate returned no Work" in outcome, outcome


def native_block_while_a_launch_waits_its_turn(block_follows: bool) -> dict[str, object]:
    """An engine all-reduce whose receives take 100 ms each, a small one behind it that waits for its turn
    in the launch order (launched later, on a stage thread), then a native coalescing block of two small
    all-reduces. What each Work raised, and every result that should be there, checked."""
    from fairring import _C

    _C._testing.set_block_follows_launches_enabled(block_follows)
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(ABOVE_64KIB))  # the engine, made
    big = rank_tensor(rank, (ABOVE_64KIB,), torch.float32, 1)
    small = rank_tensor(rank, (BELOW_64KIB,), torch.float32, 2)
    members = [rank_tensor(rank, (numel,), torch.float32, seed=numel) for numel in (5, 777)]
    works = {"engine": dist.all_reduce(big, async_op=True), "in turn": dist.all_reduce(small, async_op=True)}
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as block:
        for member in members:
            dist.all_reduce(member)
    block.wait()
    raised = {}
    for name, work in works.items():
        try:
            work.wait()
        except Exception as error:  # the negative control's outcome, reported
            raised[name] = str(error)
    for member in members:
        assert_matches(member, all_ranks_reduced((member.numel(),), torch.float32, seed=member.numel()))
    assert_matches(big, all_ranks_reduced((ABOVE_64KIB,), torch.float32, seed=1))
    if "in turn" not in raised:
        assert_matches(small, all_ranks_reduced((BELOW_64KIB,), torch.float32, seed=2))
    return raised


@pytest.mark.timeout(180)
@pytest.mark.parametrize("block_follows", [True, False], ids=["block_follows_launches", "negative_control"])
def test_a_native_coalescing_block_never_takes_in_a_launch_in_turn(block_follows: bool) -> None:
    """Issue 62, item 4 of its findings: NCCL's coalescing state is its group's, so a launch made in its
    turn on a stage thread while the caller's block is open would join the block, and two threads would be
    inside ProcessGroupNCCL at once. The block's first member waits for the launches issued before it."""
    with RankPool(Layout(2, 2), nccl_contract(seed=23, device=",receive_delay_ms=100")) as ranks:
        outcomes = ranks.run(native_block_while_a_launch_waits_its_turn, block_follows, timeout=150)
    for raised in outcomes:
        if block_follows:
            assert raised == {}, raised
        else:
            assert list(raised) == ["in turn"], raised
            assert "issued on another thread while a coalescing block was open" in raised["in turn"], raised
