"""torch's flight recorder follows fairring's collectives to completion, and dumps on failure.

torch (>= 2.15) attaches a recorder to every fairring group; fairring's
completion hooks retire each entry when its Work succeeds, and its abort hooks
dump every rank's trace when a failure settles. The analysis is torch's own
(`python -m torch.distributed.flight_recorder.fr_trace`), not fairring's.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from harness import ENGINE_AT_EVERY_SIZE, InitSpec, Layout, RankFailure, RankPool

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
    # The poller asks Works that cannot push their completion every 2 ms.
    deadline = time.monotonic() + 5
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
            assert any(name.startswith(("fairring:send", "fairring:recv")) for name in names), names
            unfinished = [entry for entry in entries if entry["state"] != "completed"]
            assert not unfinished, (rank, unfinished)
            assert all(entry["duration_ms"] is not None and entry["duration_ms"] >= 0 for entry in entries), entries


def skip_an_all_reduce(skipper: int) -> str:
    tensor = torch.ones(1000)
    dist.all_reduce(tensor)
    dist.all_reduce(tensor)
    if dist.get_rank() == skipper:
        # The others' failure reaches this rank too, which dumps on it.
        time.sleep(15)
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
