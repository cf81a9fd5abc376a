"""A wait on an engine op holds the caller's stream, not the host (docs/design.md, "The host never waits").

c10d's contract for a CUDA backend: `Work.wait()`, and a synchronous collective, make the caller's
current stream wait for the result and return. The engine's result comes back from the network, so
the wait is a device-side hold: the caller's stream waits for a word the engine's output stream
writes after the op's last local step. The emulated device models it (`caller_stream`: one caller
stream per process, on which the test queues its "kernels"); a synchronous all-reduce whose receives
take 100 ms each must return at once and its result, read on the caller's stream, must be exact.
Negative controls: with the host waiting (the old way) the call takes the whole op; with a caller's
stream that does not wait for the release, the read sees the unreduced input.

On CUDA the hold is a kernel in PTX that no GPU here runs: its text is checked by assembling it for
every GPU generation the wheel supports, where an assembler is at hand.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
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
    """Its release never comes from the device: the failure makes it from the host, the Work's next wait
    raises, and so does the next collective. Without the host's release the caller's stream stays held."""
    device = "seed=23,caller_stream" + ("" if host_release else ",drop_host_release")
    with RankPool(Layout(2, 1), emulated(device, FAIRRING_FLAT_THRESHOLD="64KiB")) as ranks:
        outcomes = ranks.run(failed_op_releases_the_callers_stream)
    assert outcomes[0]["first_wait"] == "held", outcomes[0]
    for outcome in outcomes:
        if outcome["first_wait"] == "held":  # a stream that was never held proves nothing either way
            assert outcome["released"] is host_release, outcome
        assert set(outcome["raised"]) == {"wait", "next"}, outcome


def hold_kernel_ptx() -> str:
    source = (Path(__file__).resolve().parents[1] / "csrc" / "device" / "cuda_release.cpp").read_text()
    found = re.search(r'kHoldPtx = R"\((.*?)\)";', source, re.S)
    assert found, "csrc/device/cuda_release.cpp no longer holds the hold kernel's PTX as kHoldPtx"
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
def test_the_hold_kernel_assembles_for_every_gpu_generation(text: str, tmp_path: Path) -> None:
    """The driver compiles the hold kernel's PTX at the engine's start; text it rejects would leave the host
    waiting on every GPU. The negative control drops a semicolon, which the assembler must refuse."""
    assembler = ptx_assembler()
    if assembler is None:
        pytest.skip("no ptxas here (neither on PATH nor in Triton's wheel) to assemble the hold kernel with")
    ptx = hold_kernel_ptx()
    if text == "negative_control":
        ptx = ptx.replace("nanosleep.u32 2000;", "nanosleep.u32 2000", 1)
    source = tmp_path / "hold.ptx"
    source.write_text(ptx)
    for arch in ["sm_70", "sm_80", "sm_90"]:
        result = subprocess.run(
            [assembler, f"-arch={arch}", str(source), "-o", str(tmp_path / f"hold_{arch}.cubin")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if text == "as_built":
            assert result.returncode == 0, f"{arch}: {result.stderr}"
        else:
            assert result.returncode != 0, f"{arch}: ptxas accepted PTX with a missing semicolon"
