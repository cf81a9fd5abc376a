"""How the local steps' groups are timed and stopped (csrc/local/group_steps.h), on recording groups.

The groups stand in for NCCL's: they run no collective, record what GroupSteps
asks of them, and block in abort() or shutdown() for as long as a test says, as
ncclCommAbort can while another communicator's kernel spins.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from fairring import _C
from fairring._registration import connect_local_groups

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


@pytest.mark.timeout(60)
def test_local_groups_are_connected_by_one_step_of_each_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """connect_local_groups runs, on every rank, the all-to-all then the all-gather the steps use, at
    4 KiB, 256 KiB and a slice (NCCL connects each protocol at the first size that picks it).

    Two ranks on threads, Gloo standing in for NCCL: each group records what it is asked.
    """
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    store = dist.HashStore()
    slice_bytes = 1 << 20
    calls: list[list[tuple[str, int]]] = [[], []]
    errors: list[BaseException] = []

    class Recording:
        def __init__(self, group: dist.ProcessGroupGloo, log: list[tuple[str, int]]) -> None:
            self.group, self.log = group, log

        def alltoall_base(self, output: torch.Tensor, *args: object) -> object:
            self.log.append(("all-to-all", output.numel()))
            return self.group.alltoall_base(output, *args)

        def _allgather_base(self, output: torch.Tensor, *args: object) -> object:
            self.log.append(("all-gather", output.numel()))
            return self.group._allgather_base(output, *args)

    def rank(index: int) -> None:
        try:
            groups = [
                Recording(
                    dist.ProcessGroupGloo(dist.PrefixStore(step, store), index, 2, timedelta(seconds=30)), calls[index]
                )
                for step in ("rs/", "ag/")
            ]
            connect_local_groups(groups[0], groups[1], torch.device("cpu"), 2, slice_bytes)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=rank, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    expected = [(kind, size) for size in (4096, 256 * 1024, slice_bytes) for kind in ("all-to-all", "all-gather")]
    assert calls == [expected] * 2, calls


def test_warmup_sizes_are_whole_shards_up_to_a_slice() -> None:
    from fairring._registration import warmup_sizes

    assert warmup_sizes(25 << 20, 8) == [4096, 256 * 1024, 25 << 20]
    assert warmup_sizes(100_000, 3) == [4095, 99_999]  # the middle class is above the slice
    assert warmup_sizes(2, 4) == [4]  # at least a byte per rank
