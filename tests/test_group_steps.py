"""How the local steps' groups are timed and stopped (csrc/local/group_steps.h), on recording groups.

The groups stand in for NCCL's: they run no collective, record what GroupSteps
asks of them, and block in abort() or shutdown() for as long as a test says, as
ncclCommAbort can while another communicator's kernel spins.
"""

from __future__ import annotations

import pytest

from fairring import _C

LAG_MS = 10_000  # GroupSteps::kNcclStepLag
STOP_WAIT_S = 10  # GroupSteps::kStopWait


def began_before_either_returned(events: list[str], what: str) -> bool:
    """Whether both groups' `what` calls had started before the first of them returned."""
    first_return = next(i for i, event in enumerate(events) if event.endswith(f"{what} returned"))
    return {"rs " + what, "ag " + what} <= set(events[:first_return])


@pytest.mark.timeout(60)
def test_both_groups_are_aborted_at_once() -> None:
    seconds, events = _C._testing.stop_group_steps("nccl", "abort", 60_000, 500)
    assert began_before_either_returned(events, "abort"), events
    assert seconds < 2, seconds


@pytest.mark.timeout(60)
def test_the_check_sees_aborts_made_one_after_the_other() -> None:
    """Negative control: aborting the groups in turn, as one thread would, fails the check above."""
    seconds, events = _C._testing.stop_group_steps("nccl", "sequential_abort", 60_000, 500)
    assert not began_before_either_returned(events, "abort"), events
    assert seconds >= 1.0, seconds


@pytest.mark.timeout(60)
def test_a_group_whose_abort_never_returns_does_not_hold_up_shutdown() -> None:
    seconds, events = _C._testing.stop_group_steps("nccl", "abort", 60_000, 120_000)
    assert STOP_WAIT_S - 1 < seconds < STOP_WAIT_S + 5, seconds
    assert {"rs abort", "ag abort"} <= set(events) and not any(e.endswith("returned") for e in events), events


@pytest.mark.timeout(60)
def test_a_normal_shutdown_shuts_nccl_groups_down_rather_than_aborting_them() -> None:
    _, events = _C._testing.stop_group_steps("nccl", "close", 60_000, 200)
    assert began_before_either_returned(events, "shutdown"), events
    assert not any("abort" in event for event in events), events
    # Gloo has nothing to flush: its groups are aborted, which releases a stage waiting for a step.
    _, events = _C._testing.stop_group_steps("gloo", "close", 60_000, 0)
    assert {"rs abort", "ag abort"} <= set(events) and not any("shutdown" in event for event in events), events


def test_nccl_groups_time_steps_past_the_engine() -> None:
    """ProcessGroupNCCL times a step by its group's timeout: that is set to the engine's plus the lag."""
    _, events = _C._testing.stop_group_steps("nccl", "abort", 60_000, 0)
    assert {f"rs timeout {60_000 + LAG_MS}", f"ag timeout {60_000 + LAG_MS}"} <= set(events), events
    # Gloo takes each step's own timeout, the op's remaining time: its groups are left alone.
    _, events = _C._testing.stop_group_steps("gloo", "abort", 60_000, 0)
    assert not any("timeout" in event for event in events), events
