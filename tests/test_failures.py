"""Failures: every pending and later op fails within the timeout, naming the rank that failed first; nothing hangs.

Faults are real: processes killed or frozen by signals, a namespace's link set
down. Gloo, in the same test, shows what the baseline does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import InitSpec, Layout, RankFailure, RankPool
from fairring.bench.netns import Host, NetnsCluster, netns_available
from nixl_support import RAILS_TRANSPORTS, needs_nixl, rails_env
from scenarios import make_engine

# Engine::kSettleGrace: how long a rank that saw only the effect of a failure
# waits for a neighbour to name its cause.
Engine_SETTLE_GRACE_S = 2.0


# A short group timeout, so that timeouts show within a test's time.
FAULT_TIMEOUT = timedelta(seconds=10)


def fsdp_step(tensor: torch.Tensor) -> None:
    """FSDP's traffic on `tensor`: its reduce-scatter, then the all-gather of the shard back."""
    shard = torch.empty(tensor.numel() // dist.get_world_size())
    dist.reduce_scatter_tensor(shard, tensor)
    dist.all_gather_into_tensor(tensor, shard)


STEPS = {"all_reduce": dist.all_reduce, "fsdp": fsdp_step}


def stream_until_failure(victim: int, fault: str, scratch: str, step: str = "all_reduce") -> dict[str, object]:
    """Every rank all-reduces 1 Mi floats (or runs `step`) in a stream until one fails; the victim injects
    `fault` on itself.

    "kill": SIGKILL; "stop": SIGSTOP (alive, sockets open, silent); "link": its
    host's link goes down (it runs inside that host's network namespace). The
    others report their first error, a later op's error, the seconds from the
    fault to each, and how long destroying the group took.
    """
    rank = dist.get_rank()
    tensor = torch.ones(1 << 20)
    run_step = STEPS[step]
    for _ in range(3):  # the engine is made, and every path warm
        run_step(tensor)
    folder = Path(scratch)
    if rank == victim:
        if fault == "link":
            subprocess.run(["ip", "link", "set", "eth0", "down"], check=True)
        (folder / "fault").write_text(f"{os.getpid()} {time.time()}")
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
    outcome: dict[str, object] = {}
    started = time.monotonic()
    try:
        while time.monotonic() - started < 120:
            run_step(tensor)
        outcome["first"] = "no error in 120 s"
    except RuntimeError as error:
        outcome["first"] = str(error)
        outcome["first_class"] = type(error).__name__
    failed_at = time.time()
    try:
        run_step(tensor)
        outcome["later"] = "completed"
    except RuntimeError as error:
        outcome["later"] = str(error)
        outcome["later_class"] = type(error).__name__
    outcome["later_seconds"] = time.time() - failed_at
    victim_pid, fault_time = (folder / "fault").read_text().split()
    outcome["seconds"] = failed_at - float(fault_time)
    (folder / f"failed{rank}").write_text("")
    if fault == "stop" and rank == min(set(range(dist.get_world_size())) - {victim}):
        # Once every survivor has its error, the frozen rank may go.
        survivors = dist.get_world_size() - 1
        deadline = time.monotonic() + 60
        while len(list(folder.glob("failed*"))) < survivors and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(int(victim_pid), signal.SIGKILL)
    destroy_started = time.monotonic()
    dist.destroy_process_group()
    outcome["destroy_seconds"] = time.monotonic() - destroy_started
    return outcome


def inject(
    backend: str,
    fault: str,
    tmp_path: Path,
    hosts: list[Host] | None = None,
    transport: str = "tensorpipe",
    step: str = "all_reduce",
) -> dict[int, dict[str, object]]:
    """Runs stream_until_failure on 2 machines x 2 ranks with the last rank as the victim."""
    layout = Layout(2, 2)
    victim = layout.world_size - 1
    env = rails_env(transport)
    spec = InitSpec(backend=backend, timeout=FAULT_TIMEOUT, extra_env=env)
    if hosts is not None:
        spec = InitSpec(
            method="tcp", host=hosts[0].address, port=29500, backend=backend, timeout=FAULT_TIMEOUT, extra_env=env
        )
    scratch = tmp_path / backend
    scratch.mkdir()
    ranks = RankPool(layout, spec, hosts=hosts).start()
    try:
        if fault == "link":
            return dict(enumerate(ranks.run(stream_until_failure, victim, fault, str(scratch), step, timeout=90)))
        with pytest.raises(RankFailure) as failure:
            ranks.run(stream_until_failure, victim, fault, str(scratch), step, timeout=90)
    finally:
        ranks.close()
    assert set(failure.value.results) == set(range(victim)), failure.value
    return failure.value.results


def report(title: str, outcomes: dict[str, dict[int, dict[str, object]]]) -> None:
    """Prints what each survivor saw, side by side for each backend (pytest -s shows it)."""
    print(f"\n{title}")
    for backend, by_rank in outcomes.items():
        for rank, outcome in sorted(by_rank.items()):
            first = f"{outcome.get('first_class', '')}: {str(outcome['first'])[:300]}"
            print(f"  {backend:8} rank {rank}: after {outcome['seconds']:.2f} s: {first}")


def with_gloo(fault: str, tmp_path: Path, transport: str) -> dict[str, dict[int, dict[str, object]]]:
    """fairring's outcomes over `transport`, and Gloo's beside them once (on the default transport's run)."""
    outcomes = {"fairring": inject("fairring", fault, tmp_path, transport=transport)}
    if transport == "tensorpipe":
        outcomes["gloo"] = inject("gloo", fault, tmp_path)
    return outcomes


@pytest.mark.extended
@pytest.mark.timeout(300)
def test_gloo_under_a_frozen_rank_for_comparison(tmp_path: Path) -> None:
    """What Gloo's survivors see when rank 3 freezes, to read beside fairring's (pytest -s): outside CI, where
    it would wait out the group's timeout only to print. Each survivor fails, as fairring's do."""
    outcomes = {"gloo": inject("gloo", "stop", tmp_path)}
    report("rank 3 of 2x2 freezes (SIGSTOP) mid-stream; group timeout 10 s; Gloo:", outcomes)
    assert all(outcome["first"] != "no error in 120 s" for outcome in outcomes["gloo"].values()), outcomes


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", RAILS_TRANSPORTS)
def test_a_killed_rank_is_named_by_every_survivor(tmp_path: Path, transport: str) -> None:
    outcomes = with_gloo("kill", tmp_path, transport)
    report(f"rank 3 of 2x2 is killed (SIGKILL) mid-stream; rails over {transport}:", outcomes)
    for rank, outcome in outcomes["fairring"].items():
        first = str(outcome["first"])
        assert "rank 3 (machine 1 of 2) exited, crashed or lost its network" in first, (rank, first)
        # torch's classes, which torchelastic and retry loops catch: a broken connection is the network's
        # failure where this rank saw it break, the backend's where a neighbour's notice told of it.
        assert outcome["first_class"] in ("DistNetworkError", "DistBackendError"), outcome
        assert outcome["later_class"] == "DistBackendError", outcome
        assert float(outcome["seconds"]) < FAULT_TIMEOUT.total_seconds(), outcome
        assert "earlier failure stopped the engine" in str(outcome["later"]), outcome
        assert "rank 3 (machine 1 of 2)" in str(outcome["later"]), outcome
        assert float(outcome["later_seconds"]) < 1, outcome
        assert float(outcome["destroy_seconds"]) < 5, outcome


@pytest.mark.timeout(300)
def test_a_killed_rank_is_named_during_fsdp_collectives(tmp_path: Path) -> None:
    """The engine's reduce-scatters and all-gathers fail as its all-reduces do, naming the rank."""
    outcomes = {"fairring": inject("fairring", "kill", tmp_path, step="fsdp")}
    report("rank 3 of 2x2 is killed mid-stream of reduce-scatters and all-gathers:", outcomes)
    for rank, outcome in outcomes["fairring"].items():
        first = str(outcome["first"])
        assert "rank 3 (machine 1 of 2) exited, crashed or lost its network" in first, (rank, first)
        assert float(outcome["seconds"]) < FAULT_TIMEOUT.total_seconds(), outcome
        assert "rank 3 (machine 1 of 2)" in str(outcome["later"]), outcome
        assert float(outcome["later_seconds"]) < 1, outcome


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", RAILS_TRANSPORTS)
def test_a_frozen_rank_fails_every_survivor_within_the_timeout(tmp_path: Path, transport: str) -> None:
    # Gloo beside it: test_gloo_under_a_frozen_rank_for_comparison, in the extended tier.
    outcomes = {"fairring": inject("fairring", "stop", tmp_path, transport=transport)}
    report(f"rank 3 of 2x2 freezes (SIGSTOP) mid-stream; group timeout 10 s; rails over {transport}:", outcomes)
    limit = FAULT_TIMEOUT.total_seconds() + 2 * Engine_SETTLE_GRACE_S + 1
    for rank, outcome in outcomes["fairring"].items():
        first = str(outcome["first"])
        assert "rank 3 (machine 1 of 2) stopped responding" in first, (rank, first)
        assert "timed out after 10000 ms" in first, (rank, first)
        assert outcome["first_class"] == "DistBackendError", outcome  # a timeout, as NCCL's watchdog classes it
        assert float(outcome["seconds"]) < limit, outcome
        assert float(outcome["later_seconds"]) < 1, outcome
        assert float(outcome["destroy_seconds"]) < 5, outcome


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
            message = f"{type(error).__name__}: {error}"
    work.wait()
    assert torch.all(tensor == 3), tensor[:4]
    return message


@pytest.mark.timeout(120)
def test_wait_with_timeout_raises_then_the_op_still_completes() -> None:
    with RankPool(Layout(2, 1)) as ranks:
        messages = ranks.run(late_peer_and_bounded_wait)
    assert "DistBackendError: fairring:all_reduce did not complete within 500 ms" in messages[0], messages


def mismatched_all_reduce(difference: str) -> str:
    rank = dist.get_rank()
    numel = 8192 if (difference == "size" and rank == 1) else 4096
    dtype = torch.int32 if (difference == "dtype" and rank == 1) else torch.float32
    op = dist.ReduceOp.MAX if (difference == "op" and rank == 1) else dist.ReduceOp.SUM
    try:
        dist.all_reduce(torch.ones(numel, dtype=dtype), op=op)
    except RuntimeError as error:
        return f"{type(error).__name__}: {error}"
    return "completed"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("difference", "transport"),
    [
        ("size", "tensorpipe"),
        ("dtype", "tensorpipe"),
        ("op", "tensorpipe"),
        pytest.param("size", "nixl", marks=needs_nixl),
    ],
)
def test_ranks_issuing_different_all_reduces_fail_instead_of_mixing_data(difference: str, transport: str) -> None:
    with RankPool(Layout(2, 1), InitSpec(extra_env=rails_env(transport))) as ranks:
        messages = ranks.run(mismatched_all_reduce, difference, timeout=90)
    # Found by whichever check comes first: the rails' tags, or a heartbeat's report (test_mismatches.py).
    for message in messages:
        assert "the ranks issued different" in message or "rail peer rank" in message, messages
    assert any("the ranks issued different" in message for message in messages), messages
    # The ranks disagree: the backend's failure, not the network's.
    disagreed = [message for message in messages if "issued different" in message]
    assert all(message.startswith("DistBackendError: ") for message in disagreed), messages


def cuda_delegate_stops(aborted_on_failure: bool) -> dict[str, list[str]]:
    """How a group's CUDA delegate (a stand-in for NCCL's group that records its stops) is stopped:
    a subgroup that ends normally, then the world group failed by a size mismatch."""
    from fairring import _C

    _C._testing.set_delegate_aborted_on_failure(aborted_on_failure)
    try:
        subgroup = dist.new_group([0, 1])
        ended = _C._testing.record_cuda_delegate(subgroup._get_backend(torch.device("cpu")))
        dist.all_reduce(torch.ones(4096), group=subgroup)
        dist.destroy_process_group(subgroup)
        failed = _C._testing.record_cuda_delegate(dist.group.WORLD._get_backend(torch.device("cpu")))
        outcome = mismatched_all_reduce("size")
        # Aborted off the failing thread: soon, not at once. Without the abort, a second says so.
        deadline = time.monotonic() + (10 if aborted_on_failure else 1)
        while "cuda abort" not in failed.events() and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"ended": ended.events(), "failed": failed.events(), "outcome": [outcome]}
    finally:
        _C._testing.set_delegate_aborted_on_failure(True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("aborted_on_failure", [True, pytest.param(False, id="negative_control")])
def test_a_failed_group_aborts_its_cuda_delegate_and_an_ended_one_shuts_it_down(aborted_on_failure: bool) -> None:
    """NCCL's kernels launched before a failure may wait on a rank that never launches its own: the
    failure aborts NCCL's group at once, rather than leaving them to NCCL's watchdog. A group that
    ends in good order shuts it down instead. Negative control: without the abort, nothing stops it."""
    with RankPool(Layout(2, 1)) as ranks:
        stops = ranks.run(cuda_delegate_stops, aborted_on_failure, timeout=90)
    for rank, seen in enumerate(stops):
        assert "issued different" in seen["outcome"][0] or "rail peer rank" in seen["outcome"][0], (rank, seen)
        assert "cuda abort" not in seen["ended"] and "cuda shutdown" in seen["ended"], (rank, seen)
        assert ("cuda abort" in seen["failed"]) == aborted_on_failure, (rank, seen)


def mixed_traffic_until_a_rank_dies(victim: int, aborted_on_failure: bool) -> dict[str, object]:
    """Engine all-reduces, each beside a delegated broadcast, until one fails; the victim kills itself
    mid-stream. A survivor's first error, and its CUDA delegate's stops (a stand-in for NCCL's group that
    records them) until it is aborted, or for a second without the abort."""
    from fairring import _C

    _C._testing.set_delegate_aborted_on_failure(aborted_on_failure)
    try:
        recorded = _C._testing.record_cuda_delegate(dist.group.WORLD._get_backend(torch.device("cpu")))
        rank = dist.get_rank()
        tensor, small = torch.ones(1 << 20), torch.ones(1000)
        for _ in range(3):  # the engine is made, and both paths warm
            dist.all_reduce(tensor)
            dist.broadcast(small, src=0)
        if rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        outcome: dict[str, object] = {"first": "no error in 60 s"}
        started = time.monotonic()
        try:
            while time.monotonic() - started < 60:
                works = [dist.all_reduce(tensor, async_op=True), dist.broadcast(small, src=0, async_op=True)]
                for work in works:
                    work.wait()
        except RuntimeError as error:
            outcome["first"] = str(error)
        failed = time.monotonic()
        deadline = failed + (FAULT_TIMEOUT.total_seconds() if aborted_on_failure else 1)
        while "cuda abort" not in recorded.events() and time.monotonic() < deadline:
            time.sleep(0.02)
        outcome["stops"] = recorded.events()
        outcome["abort_after_failure_s"] = time.monotonic() - failed
        return outcome
    finally:
        _C._testing.set_delegate_aborted_on_failure(True)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "aborted_on_failure", [pytest.param(True, id="aborted"), pytest.param(False, id="negative_control")]
)
def test_a_killed_rank_during_mixed_traffic_aborts_every_survivors_cuda_delegate(aborted_on_failure: bool) -> None:
    """Issue 62, item 4: a rank killed while engine all-reduces and delegated broadcasts are in flight. Every
    survivor's ops fail naming it, and its CUDA delegate (NCCL's group, whose kernels launched before the
    failure could wait for the dead rank until NCCL's watchdog) is aborted within the group's timeout.
    Negative control: without the abort, nothing stops it."""
    layout = Layout(2, 2)
    victim = layout.world_size - 1
    with RankPool(layout, InitSpec(timeout=FAULT_TIMEOUT)) as ranks:
        with pytest.raises(RankFailure) as failure:
            ranks.run(mixed_traffic_until_a_rank_dies, victim, aborted_on_failure, timeout=120)
    outcomes = failure.value.results
    assert set(outcomes) == set(range(victim)), failure.value
    for rank, outcome in outcomes.items():
        assert "rank 3 (machine 1 of 2)" in str(outcome["first"]), (rank, outcome)
        assert ("cuda abort" in outcome["stops"]) == aborted_on_failure, (rank, outcome)
        if aborted_on_failure:
            assert float(outcome["abort_after_failure_s"]) < FAULT_TIMEOUT.total_seconds(), (rank, outcome)


@pytest.mark.timeout(300)
def test_a_machine_whose_link_goes_down_is_named_by_every_rank(tmp_path: Path) -> None:
    available, reason = netns_available()
    if not available:
        pytest.skip(f"network namespaces unavailable: {reason}")
    with NetnsCluster(2) as cluster:
        outcomes = {"fairring": inject("fairring", "link", tmp_path, hosts=cluster.hosts)}
    report("machine 1 of 2x2 loses its link (eth0 down) mid-stream; group timeout 10 s:", outcomes)
    limit = FAULT_TIMEOUT.total_seconds() + 2 * Engine_SETTLE_GRACE_S + 1
    for rank, outcome in outcomes["fairring"].items():
        first = str(outcome["first"])
        assert "(machine 1 of 2)" in first, (rank, first)
        if rank >= 2:
            assert "lost its network: interface eth0 is down" in first, (rank, first)
            # Its own NIC: the network's failure; a neighbour's, as its notice tells it: the backend's.
            own = f"rank {rank} (machine 1 of 2) lost its network" in first
            assert outcome["first_class"] == ("DistNetworkError" if own else "DistBackendError"), outcome
        else:
            assert "stopped responding" in first, (rank, first)
            assert outcome["first_class"] == "DistBackendError", outcome  # a timeout, whomever it names
        assert float(outcome["seconds"]) < limit, outcome
        assert float(outcome["destroy_seconds"]) < 5, outcome


def frozen_after_set_timeout(scratch: str) -> str:
    """The group made with a long timeout, then set_timeout(10 s) on every rank; rank 3 freezes: the error
    of rank 0's next all-reduce (rank 0 then lets the frozen rank go)."""
    rank = dist.get_rank()
    tensor = torch.ones(1 << 16)
    dist.all_reduce(tensor)  # the engine, made with the group's first timeout
    dist.distributed_c10d.set_timeout(FAULT_TIMEOUT)
    dist.barrier()
    folder = Path(scratch)
    if rank == 3:
        (folder / "pid").write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    while not (folder / "pid").exists():
        time.sleep(0.05)
    try:
        dist.all_reduce(tensor)
        error = "no error"
    except RuntimeError as failure:
        error = str(failure)
    (folder / f"failed{rank}").write_text("")
    if rank == 0:
        deadline = time.monotonic() + 60
        while len(list(folder.glob("failed*"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(int((folder / "pid").read_text()), signal.SIGKILL)
    return error


@pytest.mark.timeout(180)
def test_set_timeout_moves_the_heartbeats_with_it(tmp_path: Path) -> None:
    """The heartbeat interval is a tenth of the group's timeout: made at 120 s, it would beat every 5 s and
    call a neighbour silent only after 15 s, past the 10 s timeout set later, whose error would then name
    no silent rank. Following set_timeout, every survivor names the frozen rank."""
    spec = InitSpec(timeout=timedelta(seconds=120))
    ranks = RankPool(Layout(2, 2), spec).start()
    try:
        with pytest.raises(RankFailure) as failure:
            ranks.run(frozen_after_set_timeout, str(tmp_path), timeout=90)
    finally:
        ranks.close()
    for rank, error in failure.value.results.items():
        assert "rank 3 (machine 1 of 2) stopped responding" in error, (rank, error)
        assert "timed out after 10000 ms" in error, (rank, error)


def test_a_wrapped_failure_keeps_its_torch_class() -> None:
    """What fairring adds to a failure's text (a shrink, auto's measurement) keeps the class retry loops catch."""
    from fairring._errors import dist_error_like

    causes = {
        dist.DistNetworkError("reset"): dist.DistNetworkError,
        dist.DistStoreError("timeout"): dist.DistStoreError,
        dist.DistBackendError("failed"): dist.DistBackendError,
        RuntimeError("Connection closed by peer"): dist.DistBackendError,  # Gloo's, unclassed
    }
    for cause, expected in causes.items():
        wrapped = dist_error_like(cause, "fairring: while shrinking: " + str(cause))
        assert type(wrapped) is expected, (cause, wrapped)
        assert str(wrapped) == "fairring: while shrinking: " + str(cause)
