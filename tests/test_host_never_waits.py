"""A wait on an engine op holds the caller's stream, not the host (docs/design.md, "The host never waits").

c10d's contract for a CUDA backend: `Work.wait()`, and a synchronous collective, make the caller's
current stream wait for the result and return. The engine's result comes back from the network, so
the engine launches all of an op's device work ahead of it, the work that needs the rails' bytes
waiting on the device for signals the host raises as they arrive; a wait then holds the host only
until the op is launched, and makes the caller's stream wait for its end. The emulated device models
it (`caller_stream`: one caller stream per process, on which the test queues its "kernels"); a
synchronous all-reduce whose received copies take 100 ms each must return at once and its result,
read on the caller's stream, must be exact. Negative controls: with the host waiting (the old way)
the call takes the whole op; with a caller's stream that does not wait for the op, the read sees the
unreduced input.

On CUDA a signal wait is a kernel in PTX that no GPU here runs: its text is checked by assembling it
for every GPU generation the wheel supports, where an assembler is at hand.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_emulated_device import emulated

from benchmarks.harness import Layout, RankPool
from benchmarks.reference import all_ranks_reduced, rank_tensor

SHAPE = (32_768,)  # 8 slices of 16 KiB, above the 64 KiB threshold: the engine's


def synchronous_all_reduce_behind_slow_receives() -> dict[str, object]:
    """How long a synchronous engine all-reduce held the host, how long until its result was read on
    the caller's stream, and whether that read was exact."""
    from fairring import _C

    dist.all_reduce(torch.ones(SHAPE))  # the engine, made
    _C._testing.caller_stream_synchronize()
    tensor = rank_tensor(dist.get_rank(), SHAPE, torch.float32, 3)
    seen = torch.full(SHAPE, float("nan"))
    start = time.monotonic()
    dist.all_reduce(tensor)
    held_s = time.monotonic() - start
    _C._testing.caller_stream_copy(seen, tensor)  # the caller's next kernel
    _C._testing.caller_stream_synchronize()
    op_s = time.monotonic() - start
    expected = all_ranks_reduced(SHAPE, torch.float32, seed=3)
    return {"held_s": held_s, "op_s": op_s, "exact": torch.allclose(seen, expected, rtol=1e-5, atol=1e-5)}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["device_hold", "host_waits", "caller_unordered"])
def test_a_synchronous_engine_all_reduce_holds_the_callers_stream_not_the_host(mode: str) -> None:
    device = "seed=19,receive_delay_ms=100,caller_stream" + ("" if mode == "device_hold" else f",{mode}")
    with RankPool(Layout(2, 2), emulated(device, FAIRRING_FLAT_THRESHOLD="64KiB")) as ranks:
        outcomes = ranks.run(synchronous_all_reduce_behind_slow_receives)
    for outcome in outcomes:
        if mode != "caller_unordered":
            assert outcome["op_s"] > 0.8, outcome  # 16 receive copies of 100 ms, one after another
        if mode == "device_hold":
            assert outcome["held_s"] < 0.1 * outcome["op_s"] and outcome["exact"], outcome
        elif mode == "host_waits":
            assert outcome["held_s"] > 0.9 * outcome["op_s"] and outcome["exact"], outcome
    if mode == "caller_unordered":
        assert not any(outcome["exact"] for outcome in outcomes), "a read that did not wait still matched"


def engine_case(kind: str, seed: int) -> tuple[Callable[[bool], dist.Work | None], torch.Tensor, torch.Tensor]:
    """One engine collective of `kind` over SHAPE's elements, ready to issue (synchronously or not): what
    issues it, its result, and the result it must have (a plain torch computation of every rank's input)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunk = SHAPE[0] // world
    if kind in ("all_reduce", "strided_all_reduce"):
        # A strided view: the engine reduces a contiguous copy, which goes back into it at the end.
        shape = SHAPE if kind == "all_reduce" else (SHAPE[0], 2)
        base = rank_tensor(rank, shape, torch.float32, seed)
        expected = all_ranks_reduced(shape, torch.float32, seed=seed)
        result = base if kind == "all_reduce" else base[:, 0]
        expected = expected if kind == "all_reduce" else expected[:, 0]

        def issue(async_op: bool) -> dist.Work | None:
            return dist.all_reduce(result, async_op=async_op)

        return issue, result, expected
    if kind == "reduce_scatter":
        inputs, result = rank_tensor(rank, SHAPE, torch.float32, seed), torch.empty(chunk)
        expected = all_ranks_reduced(SHAPE, torch.float32, seed=seed)[rank * chunk : (rank + 1) * chunk]

        def issue(async_op: bool) -> dist.Work | None:
            return dist.reduce_scatter_tensor(result, inputs, async_op=async_op)

        return issue, result, expected
    mine, result = rank_tensor(rank, (chunk,), torch.float32, seed), torch.empty(SHAPE)
    expected = torch.cat([rank_tensor(r, (chunk,), torch.float32, seed) for r in range(world)])

    def issue(async_op: bool) -> dist.Work | None:
        return dist.all_gather_into_tensor(result, mine, async_op=async_op)

    return issue, result, expected


def every_engine_kind_held_on_the_callers_stream() -> dict[str, dict[str, object]]:
    """Each of the engine's collectives, synchronous and not, behind slow received copies: how long it held
    the host, how long until its result was read on the caller's stream, and whether that read was exact."""
    from fairring import _C

    dist.all_reduce(torch.ones(SHAPE))  # the engine, made
    _C._testing.caller_stream_synchronize()
    outcomes: dict[str, dict[str, object]] = {}
    kinds = ("all_reduce", "strided_all_reduce", "reduce_scatter", "all_gather")
    cases = [(kind, async_op) for kind in kinds for async_op in (False, True)]
    for seed, (kind, async_op) in enumerate(cases):
        issue, result, expected = engine_case(kind, seed)
        start = time.monotonic()
        work = issue(async_op)
        if work is not None:
            work.wait()
        held_s = time.monotonic() - start
        seen = torch.full(result.shape, float("nan"))
        _C._testing.caller_stream_copy(seen, result)
        _C._testing.caller_stream_synchronize()
        outcomes[f"{kind} {'async' if async_op else 'sync'}"] = {
            "held_s": held_s,
            "op_s": time.monotonic() - start,
            "exact": torch.allclose(seen, expected, rtol=1e-5, atol=1e-5),
        }
    return outcomes


@pytest.mark.timeout(180)
def test_every_engine_collective_holds_the_callers_stream_not_the_host() -> None:
    """All-reduce (of a strided view too, whose result is copied back), reduce-scatter and all-gather (FSDP's
    pair), each synchronous and not: each returns while its received copies (100 ms each, 8 or 16 of them)
    still run, and its result read on the caller's stream is exact. The negative controls are the
    all-reduce's, above."""
    device = "seed=31,receive_delay_ms=100,caller_stream"
    with RankPool(Layout(2, 2), emulated(device, FAIRRING_FLAT_THRESHOLD="64KiB")) as ranks:
        outcomes = ranks.run(every_engine_kind_held_on_the_callers_stream, timeout=150)
    for rank, by_kind in enumerate(outcomes):
        for kind, outcome in by_kind.items():
            assert outcome["op_s"] > 0.5, (rank, kind, outcome)  # the copies ran after the issue
            assert outcome["held_s"] < 0.1 * outcome["op_s"] and outcome["exact"], (rank, kind, outcome)


def synchronous_delegated_all_reduce_behind_a_slow_engine_op() -> dict[str, object]:
    """An engine all-reduce whose received copies take 100 ms each, then a synchronous all-reduce below the
    threshold, for the delegate: how long the second held the host, how long the whole took, and whether
    both results (read on the caller's stream) were exact."""
    from fairring import _C

    rank = dist.get_rank()
    dist.all_reduce(torch.ones(SHAPE))  # the engine, made
    _C._testing.caller_stream_synchronize()
    big = rank_tensor(rank, SHAPE, torch.float32, 1)
    small = rank_tensor(rank, (1000,), torch.float32, 2)
    start = time.monotonic()
    work = dist.all_reduce(big, async_op=True)
    before_small = time.monotonic()
    dist.all_reduce(small)  # its launch takes its turn after the engine's
    held_s = time.monotonic() - before_small
    work.wait()
    _C._testing.caller_stream_synchronize()
    exact = torch.allclose(big, all_ranks_reduced(SHAPE, torch.float32, seed=1), rtol=1e-5, atol=1e-5)
    exact = exact and torch.allclose(small, all_ranks_reduced((1000,), torch.float32, seed=2), rtol=1e-5, atol=1e-5)
    return {"held_s": held_s, "op_s": time.monotonic() - start, "exact": exact}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["launching_ahead", "host_waits"])
def test_a_synchronous_delegated_op_waits_for_the_engines_launches_not_its_network(mode: str) -> None:
    """A synchronous delegated collective waits on the host for its own launch, in its turn after the
    engine's: launching ahead those wait for no network, so it holds the host a small part of the engine
    op before it; with the engine launching each step when the rails delivered (host_waits, the negative
    control) it holds the host most of it."""
    device = "seed=37,receive_delay_ms=100,caller_stream" + ("" if mode == "launching_ahead" else ",host_waits")
    with RankPool(Layout(2, 2), emulated(device, FAIRRING_FLAT_THRESHOLD="64KiB")) as ranks:
        outcomes = ranks.run(synchronous_delegated_all_reduce_behind_a_slow_engine_op)
    for outcome in outcomes:
        assert outcome["op_s"] > 0.8 and outcome["exact"], outcome
        if mode == "launching_ahead":
            assert outcome["held_s"] < 0.1 * outcome["op_s"], outcome
        else:
            assert outcome["held_s"] > 0.5 * outcome["op_s"], outcome


def failed_op_releases_the_callers_stream() -> dict[str, object]:
    """Ranks that issue different all-reduces (a sum, a max): the engine fails the op. Whether the first wait
    held the caller's stream or raised, whether that stream went on within 10 s, and what the Work and the
    next collective raised. Rank 1 issues 0.5 s late, so rank 0's wait comes long before the mismatch can
    be seen; rank 1 may see it before its own wait."""
    from fairring import _C

    dist.all_reduce(torch.ones(SHAPE))  # the engine, made
    _C._testing.caller_stream_synchronize()
    if dist.get_rank() == 1:
        time.sleep(0.5)
    op = dist.ReduceOp.MAX if dist.get_rank() == 1 else dist.ReduceOp.SUM
    work = dist.all_reduce(torch.ones(SHAPE), op=op, async_op=True)
    raised: dict[str, str] = {}
    first_wait = "held"
    try:
        work.wait()  # the hold: returns at once unless the op already failed
    except RuntimeError as error:
        first_wait, raised["wait"] = "raised", str(error)
    released = _C._testing.caller_stream_synchronize(timeout=timedelta(seconds=10))
    for name, call in [("wait", work.wait), ("next", lambda: dist.all_reduce(torch.ones(SHAPE)))]:
        try:
            call()
        except RuntimeError as error:
            raised[name] = str(error)
    return {"first_wait": first_wait, "released": released, "raised": raised}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("host_release", [True, False], ids=["released", "negative_control"])
def test_a_failed_engine_op_releases_the_callers_stream_and_fails_its_work(host_release: bool) -> None:
    """The signals its device work waits for never come from the rails: the failure opens them from the
    host, the device runs out, the Work's next wait raises, and so does the next collective. With the
    signals left shut the engine's streams, and the caller's stream behind them, stay held."""
    device = "seed=23,caller_stream" + ("" if host_release else ",signals_stay_shut")
    with RankPool(Layout(2, 1), emulated(device, FAIRRING_FLAT_THRESHOLD="64KiB")) as ranks:
        outcomes = ranks.run(failed_op_releases_the_callers_stream)
    assert outcomes[0]["first_wait"] == "held", outcomes[0]
    for outcome in outcomes:
        if outcome["first_wait"] == "held":  # a stream that was never held proves nothing either way
            assert outcome["released"] is host_release, outcome
        assert set(outcome["raised"]) == {"wait", "next"}, outcome


def wait_kernel_ptx() -> str:
    source = (Path(__file__).resolve().parents[1] / "csrc" / "device" / "cuda_signals.cpp").read_text()
    found = re.search(r'kWaitPtx = R"\((.*?)\)";', source, re.S)
    assert found, "csrc/device/cuda_signals.cpp no longer holds the signal wait kernel's PTX as kWaitPtx"
    return found.group(1)


def ptx_assembler() -> str | None:
    """ptxas from the CUDA toolkit or from Triton's wheel (which torch's CUDA wheels bring)."""
    on_path = shutil.which("ptxas")
    if on_path:
        return on_path
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return str(bundled) if bundled.exists() else None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("text", ["as_built", "negative_control"])
def test_the_signal_wait_kernel_assembles_for_every_gpu_generation(text: str, tmp_path: Path) -> None:
    """The driver compiles the signal wait kernel's PTX at the engine's start; text it rejects would leave
    the host waiting on every GPU. The negative control drops a semicolon, which the assembler must refuse."""
    assembler = ptx_assembler()
    if assembler is None:
        pytest.skip("no ptxas here (neither on PATH nor in Triton's wheel) to assemble the wait kernel with")
    ptx = wait_kernel_ptx()
    if text == "negative_control":
        ptx = ptx.replace("nanosleep.u32 2000;", "nanosleep.u32 2000", 1)
    source = tmp_path / "wait.ptx"
    source.write_text(ptx)
    for arch in ["sm_70", "sm_80", "sm_90"]:
        result = subprocess.run(
            [assembler, f"-arch={arch}", str(source), "-o", str(tmp_path / f"wait_{arch}.cubin")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if text == "as_built":
            assert result.returncode == 0, f"{arch}: {result.stderr}"
        else:
            assert result.returncode != 0, f"{arch}: ptxas accepted PTX with a missing semicolon"
