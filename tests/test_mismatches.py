"""Ranks that issue different collectives fail at once, on every rank and whatever path each took.

Before any data moves, two ranks that disagree may wait in different places:
one in the engine, another in Gloo (a small all-reduce below the flat
threshold, a dtype the engine does not take, another collective first). Each
rank's heartbeat reports its latest collective (csrc/backend/ledger.h), so a
neighbour that issued something else at that number fails the group, naming
both. Gloo, in the same test, shows what the baseline does.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import fairring
from benchmarks.harness import InitSpec, Layout, RankFailure, RankPool
from fairring import _C

# Heartbeats every timeout / 10: a mismatch shows within about a second.
GROUP_TIMEOUT = timedelta(seconds=10)
# The warm-up all-reduce is above it (the engine), the small one below (Gloo).
FLAT_THRESHOLD = {"FAIRRING_FLAT_THRESHOLD": "64KiB"}
LARGE = 1 << 16  # floats: 256 KiB
SAME_COLLECTIVES = "the ranks issued different collectives"


# -- the ledger, without a network ----------------------------------------------


def test_ledgers_that_agree_find_nothing_and_any_difference_is_found() -> None:
    mine, theirs = _C._testing.CollectiveLedger(), _C._testing.CollectiveLedger()
    for signature in ["all_reduce cpu Float[4096] sum", "broadcast cpu", "barrier"]:
        assert mine.record(signature)[1] is None
        theirs.record(signature)
        assert mine.compare(1, theirs.report()) is None
    # The same signature at #4, but a different history before it.
    other = _C._testing.CollectiveLedger()
    for signature in ["all_reduce cpu Float[4096] sum", "barrier", "broadcast cpu", "barrier"]:
        other.record(signature)
    mine.record("barrier")
    assert mine.compare(2, other.report()) == (2, 4, "barrier", "barrier")


def test_a_report_from_ahead_is_compared_when_this_rank_gets_there() -> None:
    mine, theirs = _C._testing.CollectiveLedger(), _C._testing.CollectiveLedger()
    theirs.record("broadcast cpu")
    theirs.record("all_reduce cpu Float[16] sum")
    mine.record("broadcast cpu")
    assert mine.compare(3, theirs.report()) is None  # #2 not issued here yet
    assert mine.record("all_reduce cpu Float[65536] sum") == (
        2,
        (3, 2, "all_reduce cpu Float[65536] sum", "all_reduce cpu Float[16] sum"),
    )


def test_reports_older_than_what_the_ledger_keeps_are_not_compared() -> None:
    mine, theirs = _C._testing.CollectiveLedger(), _C._testing.CollectiveLedger()
    theirs.record("barrier")
    old_report = theirs.report()
    for _ in range(5000):
        mine.record("broadcast cpu")
    assert mine.compare(1, old_report) is None


@pytest.mark.parametrize(
    "report",
    ["", "1", "1 ab", "1 ab ", "0 ab barrier", "x ab barrier", "1 xyz barrier", "-1 ab barrier", "1  barrier"],
)
def test_a_malformed_report_is_a_disagreement_quoting_it(report: str) -> None:
    ledger = _C._testing.CollectiveLedger()
    ledger.record("barrier")
    found = ledger.compare(1, report)
    assert found is not None and found[1] == 0 and "malformed" in found[3], found


# -- real ranks ---------------------------------------------------------------------


def issue_differently(case: str) -> dict[str, object]:
    """Every rank warms the engine up, then the last rank issues something else than the others."""
    rank, last = dist.get_rank(), dist.get_world_size() - 1
    dist.all_reduce(torch.ones(LARGE))
    odd = rank == last
    started = time.monotonic()
    try:
        if case == "size":  # the odd rank's all-reduce goes to Gloo, the others' to the engine
            dist.all_reduce(torch.ones(16 if odd else LARGE))
        elif case == "dtype":  # the engine does not reduce bool
            dist.all_reduce(torch.ones(LARGE, dtype=torch.bool if odd else torch.float32), op=dist.ReduceOp.MAX)
        elif case == "kind":  # both on the engine: a reduce-scatter against an all-gather
            world = dist.get_world_size()
            if odd:
                dist.all_gather_into_tensor(torch.empty(LARGE * world), torch.ones(LARGE))
            else:
                dist.reduce_scatter_tensor(torch.empty(LARGE), torch.ones(LARGE * world))
        elif case == "order":
            steps = [lambda: dist.broadcast(torch.ones(4), src=0), lambda: dist.all_reduce(torch.ones(LARGE))]
            for step in reversed(steps) if odd else steps:
                step()
        message = "completed"
    except RuntimeError as error:
        message = str(error)
    seconds = time.monotonic() - started
    later_started = time.monotonic()
    try:
        dist.barrier()
        later = "completed"
    except RuntimeError as error:
        later = str(error)
    return {"message": message, "seconds": seconds, "later": later, "later_seconds": time.monotonic() - later_started}


def run_case(backend: str, case: str) -> dict[int, dict[str, object]]:
    spec = InitSpec(backend=backend, timeout=GROUP_TIMEOUT, extra_env=FLAT_THRESHOLD)
    with RankPool(Layout(2, 2), spec) as ranks:
        try:
            return dict(enumerate(ranks.run(issue_differently, case, timeout=90)))
        except RankFailure as failure:  # Gloo may crash on mismatched input
            return {rank: {"message": outcome, "seconds": float("nan")} for rank, outcome in failure.outcomes.items()}


def report(case: str, outcomes: dict[str, dict[int, dict[str, object]]]) -> None:
    """Prints what each rank saw, side by side for each backend (pytest -s shows it)."""
    print(f"\nrank 3 of 2x2 issues a different collective ({case}); group timeout 10 s:")
    for backend, by_rank in outcomes.items():
        for rank, outcome in sorted(by_rank.items()):
            seconds, message = float(outcome["seconds"]), str(outcome["message"])
            print(f"  {backend:8} rank {rank}: after {seconds:.2f} s: {message[:260]}")


@pytest.mark.extended
@pytest.mark.timeout(240)
def test_gloo_under_a_size_mismatch_for_comparison() -> None:
    """What Gloo's ranks see when rank 3 all-reduces another size, to read beside fairring's (pytest -s):
    outside CI, where it would wait out the group's timeout (or a Gloo crash) only to print. No rank
    completes its collective on Gloo either."""
    outcomes = {"gloo": run_case("gloo", "size")}
    report("size", outcomes)
    assert all(outcome["message"] != "completed" for outcome in outcomes["gloo"].values()), outcomes


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", ["size", "dtype", "kind", "order"])
def test_ranks_on_different_paths_all_fail_at_once_naming_both(case: str) -> None:
    # Gloo beside it: test_gloo_under_a_size_mismatch_for_comparison, in the extended tier.
    outcomes = {"fairring": run_case("fairring", case)}
    report(case, outcomes)
    for rank, outcome in outcomes["fairring"].items():
        message = str(outcome["message"])
        assert SAME_COLLECTIVES in message, (rank, message)
        assert "rank 3 (machine 1 of 2)" in message, (rank, message)
        # A heartbeat interval (1 s) and the notice's flood, well within the timeout.
        assert float(outcome["seconds"]) < GROUP_TIMEOUT.total_seconds() / 2, (rank, outcome)
        # The group has failed: later collectives are refused at once, not left to hang.
        assert SAME_COLLECTIVES in str(outcome["later"]), (rank, outcome)
        assert float(outcome["later_seconds"]) < 1, (rank, outcome)


def all_reduce_with_its_own_timeout() -> tuple[str, float]:
    """Rank 1 comes 6 s late; rank 0's all-reduce has a 2 s timeout of its own (the group's is 60 s)."""
    tensor = torch.ones(LARGE)
    dist.all_reduce(tensor)  # the engine is made
    if dist.get_rank() == 1:
        time.sleep(6)
        tensor = torch.ones(LARGE)
        work = dist.all_reduce(tensor, async_op=True)
    else:
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.SUM
        options.timeout = timedelta(seconds=2)
        work = fairring.backend_of().allreduce([tensor], options)
    started = time.monotonic()
    try:
        work.wait()
        message = "completed"
    except RuntimeError as error:
        message = str(error)
    return message, time.monotonic() - started


@pytest.mark.timeout(120)
def test_an_all_reduce_fails_by_its_own_timeout_shorter_than_the_group_s() -> None:
    with RankPool(Layout(2, 1)) as ranks:
        outcomes = ranks.run(all_reduce_with_its_own_timeout, timeout=90)
    message, seconds = outcomes[0]
    assert "timed out after 2000 ms" in message, message
    assert 1.5 < seconds < 2 + 2 * 2.0 + 1, outcomes  # its timeout, at most the settle grace later
