"""torch's flight recorder follows fairring's collectives to completion, and dumps on failure.

torch (>= 2.15) attaches a recorder to every fairring group; fairring's
completion hooks retire each entry when its Work succeeds, and its abort hooks
dump every rank's trace when a failure settles. The analysis is torch's own
(`python -m torch.distributed.flight_recorder.fr_trace`), not fairring's.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import fairring
from benchmarks.harness import ENGINE_AT_EVERY_SIZE, InitSpec, Layout, RankFailure, RankPool

pytestmark = pytest.mark.skipif(
    not hasattr(torch._C._distributed_c10d, "FlightRecorderHook"),
    reason=f"torch {torch.__version__} has no backend-agnostic flight recorder (torch >= 2.15 has)",
)

# No stack traces in dumps: symbolizing them is slow and says nothing here.
ENV = {**ENGINE_AT_EVERY_SIZE, "TORCH_INCLUDE_STACK_TRACE": "0"}


def fairring_entries() -> list[dict[str, object]]:
    from torch._C._distributed_c10d import _dump_fr_trace

    trace = pickle.loads(_dump_fr_trace(backend="fairring"))
    return [
        {"name": entry["profiling_name"], "state": entry["state"], "duration_ms": entry.get("duration_ms")}
        for entry in trace.get("entries", [])
    ]


def one_of_each_kind() -> list[dict[str, object]]:
    """Engine, delegated, point-to-point, coalesced and barrier Works, all waited for."""
    rank, size = dist.get_rank(), dist.get_world_size()
    tensor = torch.ones(10_000)
    dist.all_reduce(tensor)  # the engine
    dist.all_reduce(tensor, async_op=True).wait()
    dist.all_reduce_coalesced([torch.ones(100), torch.ones(7)])
    dist.broadcast(tensor, src=0)  # Gloo
    dist.all_gather([torch.empty(3) for _ in range(size)], torch.ones(3))
    dist.reduce_scatter_tensor(torch.empty(1000), torch.ones(1000 * size))  # the engine's, as FSDP's
    dist.all_gather_into_tensor(torch.empty(1000 * size), torch.ones(1000))
    with dist._coalescing_manager(async_ops=True) as coalesced:
        dist.reduce_scatter_tensor(torch.empty(10), torch.ones(10 * size))
        dist.reduce_scatter_tensor(torch.empty(7), torch.ones(7 * size))
    coalesced.wait()
    dist.barrier()
    ops = [
        dist.P2POp(dist.isend, torch.ones(5), (rank + 1) % size),
        dist.P2POp(dist.irecv, torch.empty(5), (rank - 1) % size),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    if rank % 2 == 0:
        dist.send(torch.ones(4), rank + 1)
    else:
        dist.recv(torch.empty(4), rank - 1)
    # The poller asks Works that cannot push their completion every 2 ms; the
    # deadline is for a loaded machine (ASan, 4 ranks on 2 CPUs): a completion
    # that was lost never arrives, however long this waits.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        entries = fairring_entries()
        if all(entry["state"] == "completed" for entry in entries):
            break
        time.sleep(0.05)
    return entries


def test_every_kind_of_work_reads_completed() -> None:
    with RankPool(Layout(2, 2), InitSpec(extra_env=ENV)) as ranks:
        for rank, entries in enumerate(ranks.run(one_of_each_kind)):
            names = [entry["name"] for entry in entries]
            assert "fairring:all_reduce" in names, names
            assert "fairring:barrier" in names, names
            # As NCCL names them in its own flight recorder.
            for engine_op in ("_reduce_scatter_base", "_all_gather_base", "reduce_scatter_tensor_coalesced"):
                assert f"fairring:{engine_op}" in names, " ".join(names)
            assert any(name.startswith(("fairring:send", "fairring:recv")) for name in names), names
            unfinished = [entry for entry in entries if entry["state"] != "completed"]
            assert not unfinished, (rank, unfinished)
            assert all(entry["duration_ms"] is not None and entry["duration_ms"] >= 0 for entry in entries), entries


def skip_an_all_reduce(skipper: int) -> str:
    tensor = torch.ones(1000)
    dist.all_reduce(tensor)
    dist.all_reduce(tensor)
    if dist.get_rank() == skipper:
        # The others' failure reaches this rank too, which dumps on it: wait for its dump (the others
        # time out after the group's 5 s), then a moment for the file to be whole.
        dump = Path(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(skipper))
        deadline = time.monotonic() + 30
        while not dump.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        return "skipped"
    try:
        dist.all_reduce(tensor)
    except RuntimeError as error:
        return str(error)
    return "completed"


@pytest.mark.timeout(180)
def test_fr_trace_names_the_rank_that_skipped_an_all_reduce(tmp_path: Path) -> None:
    prefix = tmp_path / "fairring_trace_rank_"
    env = {**ENV, "TORCH_FR_DUMP_TEMP_FILE": str(prefix)}
    with RankPool(Layout(2, 2), InitSpec(extra_env=env, timeout=timedelta(seconds=5))) as ranks:
        try:
            outcomes = ranks.run(skip_an_all_reduce, 3, timeout=90)
        except RankFailure as failure:
            pytest.fail(f"a rank did not return: {failure}")
    assert outcomes[3] == "skipped"
    for rank in range(3):
        assert "all_reduce #3" in outcomes[rank] and "timed out" in outcomes[rank], outcomes[rank]
    # Every rank dumped, the one that skipped included.
    dumps = sorted(path.name for path in tmp_path.iterdir())
    assert dumps == [f"fairring_trace_rank_{rank}" for rank in range(4)], dumps
    for rank in range(3):
        entries = pickle.loads((tmp_path / f"fairring_trace_rank_{rank}").read_bytes())["entries"]
        states = [entry["state"] for entry in entries if entry["profiling_name"] == "fairring:all_reduce"]
        # The failed all-reduce is never reported complete.
        assert states == ["completed", "completed", "scheduled"], states
    analysis = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(tmp_path), "-p", prefix.name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = analysis.stdout + analysis.stderr
    assert "Not all ranks joining collective" in report, report
    assert "missing ranks: {3}" in report, report


# Longer than the slack the test allows the error: a hook run before the error would show.
SLOW_HOOK_S = 3.0


def time_out_while_a_slow_hook_dumps(scratch: str) -> dict[str, object]:
    """Rank 1 freezes; rank 0's all-reduce times out while its abort hooks (a slow one of the test's, and
    torch's dump) run. Rank 0 reports when the error came, and whether the slow hook had ended by then."""
    folder = Path(scratch)
    tensor = torch.ones(1 << 16)
    dist.all_reduce(tensor)
    if dist.get_rank() == 1:
        (folder / "frozen").write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)

    def slow_dump() -> None:
        time.sleep(SLOW_HOOK_S)
        (folder / "slow_hook_done").write_text(str(time.time()))

    fairring.backend_of(dist.group.WORLD).register_abort_hook(0x5EED, slow_dump)  # an id torch does not use
    started = time.time()
    try:
        dist.all_reduce(tensor)
        error = "completed"
    except RuntimeError as raised:
        error = str(raised)
    raised_at = time.time()
    hook_done_when_raised = (folder / "slow_hook_done").exists()
    os.kill(int((folder / "frozen").read_text()), signal.SIGKILL)
    # As a job does on a failure: the group goes at once. The dump still comes.
    destroy_started = time.monotonic()
    dist.destroy_process_group()
    return {
        "error": error,
        "seconds": raised_at - started,
        "raised_at": raised_at,
        "hook_done_when_raised": hook_done_when_raised,
        "destroy_s": time.monotonic() - destroy_started,
    }


@pytest.mark.timeout(120)
def test_the_error_comes_within_the_timeout_and_the_dump_before_exit(tmp_path: Path) -> None:
    """The abort hooks run beside the error, not ahead of it; the process waits for them as it exits."""
    timeout = timedelta(seconds=5)
    env = {**ENV, "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "trace_rank_")}
    with RankPool(Layout(2, 1), InitSpec(extra_env=env, timeout=timeout)) as ranks:
        with pytest.raises(RankFailure) as failure:
            ranks.run(time_out_while_a_slow_hook_dumps, str(tmp_path), timeout=60)
    outcome = failure.value.results[0]
    print(outcome)
    assert "rank 1 (machine 1 of 2) stopped responding" in str(outcome["error"]), outcome
    assert float(outcome["seconds"]) < timeout.total_seconds() + 1, outcome
    assert not outcome["hook_done_when_raised"], outcome
    # Destroying the group waited for the hooks, which began with the error.
    assert float((tmp_path / "slow_hook_done").read_text()) > float(outcome["raised_at"]), outcome
    assert SLOW_HOOK_S - 1 < float(outcome["destroy_s"]) < SLOW_HOOK_S + 5, outcome
    assert (tmp_path / "trace_rank_0").exists(), sorted(path.name for path in tmp_path.iterdir())
