"""Shared-memory local steps (csrc/local/shared_memory.*), between real processes.

The steps are driven directly here, each rank's result checked against a plain
torch computation of every rank's input; test_all_reduce and the others run
them inside the engine on every layout with 2+ ranks per machine.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import Layout, RankPool
from benchmarks.reference import all_ranks_reduced, assert_matches, rank_tensor

pytestmark = pytest.mark.timeout(180)

STEP_TIMEOUT = timedelta(seconds=30)
ENTRY_BYTES = 512 * 1024  # SharedMemorySteps::kEntryBytes


def c_testing() -> Any:
    """The extension's test-only functions, imported in the rank that calls them."""
    from fairring import _C

    return _C._testing


def _local_worker(
    rank: int, size: int, port: int, disabled: bool, scenario: Callable[..., Any], args: tuple, conn: Connection
) -> None:
    from fairring import _C
    from fairring._shared_memory import shared_memory_steps

    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logging.getLogger("fairring").addHandler(Keep())
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        topology = _C.Topology(rank, [list(range(size))])
        steps = shared_memory_steps(store, topology, disabled, timedelta(seconds=30))
        conn.send(("ok", scenario(steps, rank, size, messages, *args)))
    except Exception as error:  # reported to the test
        conn.send(("error", f"{type(error).__name__}: {error}"))


def run_local(
    size: int, scenario: Callable[..., Any], *args: Any, disabled: tuple[int, ...] = (), timeout: float = 90
) -> list[tuple[str, Any]]:
    """Runs scenario(steps, rank, size, log, *args) on `size` ranks of one machine; (status, value) by rank."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    context = mp.get_context("spawn")
    processes, conns = [], []
    try:
        for rank in range(size):
            parent, child = context.Pipe()
            process = context.Process(
                target=_local_worker,
                args=(rank, size, store.port, rank in disabled, scenario, args, child),
                daemon=True,
            )
            process.start()
            child.close()
            processes.append(process)
            conns.append(parent)
        deadline = time.monotonic() + timeout
        results = []
        for rank, conn in enumerate(conns):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                raise AssertionError(f"rank {rank} gave no answer within {timeout} s")
            results.append(conn.recv())
        return results
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()


def values(rank: int, round_: int, numel: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    """Rank `rank`'s input: small integers, exact in every dtype and under every op."""
    generator = torch.Generator().manual_seed(1000 * rank + round_)
    low, high = (1, 3) if op == "product" else (-8, 9)
    return torch.randint(low, high, (numel,), generator=generator).to(dtype)


def exchange(steps: Any, rank: int, size: int, log: list[str], dtype_name: str, op: str, slot_numel: int) -> str:
    """Three rounds of each step (the rings wrap), every result checked."""
    assert steps is not None, f"no shared memory: {log}"
    dtype = getattr(torch, dtype_name)
    reduce = {"sum": torch.sum, "max": torch.amax, "min": torch.amin, "product": torch.prod}[op]
    for round_ in range(3):
        inputs = [values(r, round_, size * slot_numel, dtype, op) for r in range(size)]
        slot = torch.full((slot_numel,), 99, dtype=dtype)
        c_testing().local_reduce_scatter(steps, slot, inputs[rank], op, seq=round_, slice=0, timeout=STEP_TIMEOUT)
        parts = torch.stack([x.view(size, slot_numel)[rank] for x in inputs]).to(torch.float64)
        expected = reduce(parts, dim=0).to(dtype)
        assert torch.equal(slot, expected), f"round {round_}: reduce-scatter differs from torch's {op}"

        slots = [values(r, 100 + round_, slot_numel, dtype, op) for r in range(size)]
        output = torch.full((size * slot_numel,), 99, dtype=dtype)
        c_testing().local_all_gather(steps, output, slots[rank], seq=round_, slice=0, timeout=STEP_TIMEOUT)
        assert torch.equal(output, torch.cat(slots)), f"round {round_}: all-gather differs from the slots"
    return steps.segment_name


@pytest.mark.parametrize(
    ("size", "dtype", "op", "slot_numel"),
    [
        (2, "float32", "sum", 1),
        (2, "float32", "sum", 3 * ENTRY_BYTES // 4 + 5),  # uneven chunks, past the ring's depth
        (3, "float16", "sum", ENTRY_BYTES // 2 + 7),
        (3, "bfloat16", "max", 1000),
        (4, "int64", "min", ENTRY_BYTES // 8 * 3 + 1),
        (2, "int32", "product", 4099),
        (4, "uint8", "sum", 3),
    ],
)
def test_steps_match_torch(size: int, dtype: str, op: str, slot_numel: int) -> None:
    results = run_local(size, exchange, dtype, op, slot_numel)
    assert [status for status, _ in results] == ["ok"] * size, results
    # Every rank removed its name once all had mapped it: nothing is left behind.
    for _, name in results:
        assert not os.path.exists(f"/dev/shm{name}"), f"{name} was not unlinked"


def mismatched(steps: Any, rank: int, size: int, log: list[str], what: str) -> str:
    slot_numel = 1024 + (rank if what == "size" else 0)
    input_ = torch.ones(size * slot_numel)
    slot = torch.empty(slot_numel)
    slice_ = rank if what == "slice" else 0
    started = time.monotonic()
    with pytest.raises(RuntimeError) as error:
        c_testing().local_reduce_scatter(steps, slot, input_, "sum", seq=7, slice=slice_, timeout=timedelta(seconds=5))
    assert time.monotonic() - started < 4, "the mismatch was found only by the timeout"
    return str(error.value)


@pytest.mark.parametrize("what", ["slice", "size"])
def test_ranks_that_disagree_fail(what: str) -> None:
    results = run_local(2, mismatched, what)
    assert [status for status, _ in results] == ["ok", "ok"], results
    for rank, (_, message) in enumerate(results):
        assert "the ranks of this machine issued different all-reduces" in message
        assert f"rank {1 - rank} sent all_reduce #7 slice {1 - rank if what == 'slice' else 0}" in message, message


def waits_alone(steps: Any, rank: int, size: int, log: list[str], how: str) -> tuple[float, str]:
    if rank != 0:
        time.sleep(0.5)
        return 0.0, ""
    timeout = timedelta(seconds=1 if how == "timeout" else 30)
    if how == "abort":
        threading.Timer(0.3, steps.abort).start()
    started = time.monotonic()
    try:
        c_testing().local_all_gather(steps, torch.empty(2 * 64), torch.ones(64), seq=0, slice=0, timeout=timeout)
    except RuntimeError as error:
        return time.monotonic() - started, str(error)
    return time.monotonic() - started, "returned"


def test_absent_peer_times_out_naming_it() -> None:
    (_, (elapsed, message)), _ = run_local(2, waits_alone, "timeout")
    assert "timed out waiting for rank 1 of this machine to publish its part" in message
    assert 0.9 < elapsed < 3.0


def test_abort_ends_a_wait_at_once() -> None:
    (_, (elapsed, message)), _ = run_local(2, waits_alone, "abort")
    assert "the engine stopped while the step was in flight" in message
    assert elapsed < 1.0


def reports(steps: Any, rank: int, size: int, log: list[str]) -> tuple[bool, list[str]]:
    return steps is not None, log


def test_one_rank_without_shared_memory_sends_its_machine_to_gloo() -> None:
    results = run_local(3, reports, disabled=(1,))
    assert [value[0] for _, value in results] == [False, False, False]
    warning = results[0][1][1]
    assert any("FAIRRING_SHM_DISABLE is set on rank 1" in message for message in warning), warning


def test_a_full_dev_shm_is_refused_with_the_reason() -> None:
    """A container's small /dev/shm: a mount namespace with a 1 MiB one."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("needs root and unshare(1) to mount a small /dev/shm in a mount namespace")
    script = (
        "mount -t tmpfs -o size=1m tmpfs /dev/shm && "
        f"{sys.executable} -c 'from fairring import _C; _C.SharedMemorySteps(0, [0, 1])'"
    )
    result = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert result.returncode != 0
    assert "cannot allocate" in result.stderr and "(/dev/shm: 1 MiB free of 1 MiB)" in result.stderr, result.stderr


def local_steps_and_result(seed: int) -> str:
    rank = dist.get_rank()
    tensor = rank_tensor(rank, (3 << 20) + 11, torch.float32, seed)
    dist.all_reduce(tensor)
    assert_matches(tensor, all_ranks_reduced(((3 << 20) + 11,), torch.float32, seed=seed))
    return dist.group.WORLD._get_backend(torch.device("cpu")).engine_stats()["local_steps"]


def test_engine_uses_shared_memory_where_a_whole_machine_can() -> None:
    """2 x 2: machine 0 has a rank with FAIRRING_SHM_DISABLE=1, so both its ranks use Gloo."""
    layout = Layout(machines=2, ranks_per_machine=2)
    with RankPool(layout, rank_env={0: {"FAIRRING_SHM_DISABLE": "1"}}) as pool:
        steps = pool.run(local_steps_and_result, 4)
    expected = ["gloo" if layout.machine_of(rank) == 0 else "shared memory" for rank in range(4)]
    assert steps == expected


def seconds_to_set_while(waiting: Callable[[dist.Store], object]) -> float:
    """How long a set takes on a TCPStore client while another thread of this process runs `waiting` on it."""
    from fairring.bench import free_port

    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=timedelta(seconds=10))

    def wait() -> None:
        try:
            waiting(store)
        except dist.DistStoreError:
            pass  # the negative control's wait for a key that never comes

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    start = time.monotonic()
    store.set("peer/0", "published")  # what the waiting thread awaits
    took = time.monotonic() - start
    waiter.join(timeout=10)
    return took


def test_setup_leaves_the_store_free_for_another_groups_setup() -> None:
    """Two groups set up at once on two threads share one TCPStore client: the machine's gather polls, so the
    other thread's set goes through (it hung before: each rank's wait held the set its peer awaited)."""
    from fairring._shared_memory import _gather

    assert seconds_to_set_while(lambda store: _gather(store, "peer/", 1, timedelta(seconds=5))) < 1.0
    # Negative control: a blocking wait holds the client until it ends (here after 2 s).
    assert seconds_to_set_while(lambda store: store.wait(["never"], timedelta(seconds=2))) > 1.0


# --- who may open a segment ---

NOBODY = 65534


def _copied_segment(source_name: str, uid: int, mode: int) -> str:
    """A byte-for-byte copy of a real rank's segment (a layout that passes every other check), owned
    by `uid` with `mode`, as another user could plant and publish it; returns its shm name."""
    name = f"/fairring-planted-{os.getpid()}-{uid}-{mode:o}"
    shutil.copyfile(f"/dev/shm{source_name}", f"/dev/shm{name}")
    os.chown(f"/dev/shm{name}", uid, -1)
    os.chmod(f"/dev/shm{name}", mode)
    return name


@pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root (CI runs as root)")
@pytest.mark.parametrize(
    ("uid", "mode", "refusal"),
    [
        (NOBODY, 0o600, f"belongs to uid {NOBODY} with mode 0600"),
        (0, 0o644, "belongs to uid 0 with mode 0644"),
        (0, 0o600, None),  # the negative control: the same bytes, this user's and private, are mapped
    ],
)
def test_a_segment_another_user_could_write_is_not_mapped(uid: int, mode: int, refusal: str | None) -> None:
    from fairring import _C

    own, peer = _C.SharedMemorySteps(0, [0, 1]), _C.SharedMemorySteps(1, [0, 1])
    planted = _copied_segment(peer.segment_name, uid, mode)
    try:
        if refusal is None:
            own.attach([own.segment_name, planted])
        else:
            with pytest.raises(RuntimeError, match=refusal) as error:
                own.attach([own.segment_name, planted])
            assert "no other user may open" in str(error.value)
    finally:
        os.unlink(f"/dev/shm{planted}")
        own.unlink()
        peer.unlink()


def _opens_as_nobody(path: str) -> bool:
    """Whether a child process running as another user (nobody) can open `path` for reading."""
    child = os.fork()
    if child == 0:
        try:
            os.setuid(NOBODY)
            os.close(os.open(path, os.O_RDONLY))
            os._exit(0)
        except PermissionError:
            os._exit(1)
        except BaseException:  # anything else is the test's failure, not a refusal
            os._exit(2)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 1), f"the child failed for another reason (exit {code})"
    return code == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root (CI runs as root)")
def test_another_user_cannot_open_a_ranks_segment() -> None:
    from fairring import _C

    steps = _C.SharedMemorySteps(0, [0, 1])
    control = _copied_segment(steps.segment_name, 0, 0o644)
    try:
        assert os.stat(f"/dev/shm{steps.segment_name}").st_mode & 0o777 == 0o600
        assert not _opens_as_nobody(f"/dev/shm{steps.segment_name}")
        assert _opens_as_nobody(f"/dev/shm{control}"), "the negative control: a readable segment opens"
    finally:
        os.unlink(f"/dev/shm{control}")
        steps.unlink()
