"""fairring's GPU check: the CUDA tests and CUDA benches, written to one report (`make gpu-check`).

Needs no network and no virtual environment: run it with the python whose
torch fairring was just built against (`make gpu-check` builds first). Stages,
each with its own time limit inside --budget, so the whole check ends in time:

Stages in order of value:

1. environment: python, torch, CUDA, NCCL, the compiler, nvcc, fairring.build_info(), the GPUs;
2. versus NCCL (benchmarks/versus_nccl.py): MPS started where the machine lets it (and
   stopped after), each machine a network namespace whose NIC is shaped to 10 Gbit/s, NCCL
   on its socket transport through it; on 2 machines x 2 ranks, then x 4 where the time
   allows (not with --quick), the engine, NCCL's all-reduce and FAIRRING_CUDA_ENGINE=auto's
   routing at 4 to 256 MiB on the same tensors, the order rotated every iteration, every
   result checked, with the fraction of the bound; and, on 2 x 2, 8 buckets of 25 MiB
   issued at once, the engine against NCCL (what the op boundary costs), then FSDP's
   reduce-scatter and all-gather at the same sizes (engine, NCCL, auto), where the stage's
   time allows; skipped, saying why, where namespaces cannot be made;
3. tests: `python -m pytest tests/test_cuda.py -rs -s -p no:cacheprovider`;
4. correctness on the layouts of --worlds with several ranks per machine (2x2, 3x2),
   whose local steps run on real NCCL groups (a distinct NCCL_HOSTID per process,
   NCCL's socket transport on loopback): every dtype and op against plain torch on
   the CPU; the first layout with the GPU in launch order (CUDA_DEVICE_MAX_CONNECTIONS=1,
   the engine kept there by FAIRRING_SERIALIZED_LAUNCHES=engine) and the default flat
   threshold, so that NCCL's own small all-reduces are launched among the engine's; the
   second started as a job set up for NCCL starts (a ProcessGroupNCCL.Options as
   pg_options, device_id), so that both reach real NCCL groups. Each also runs
   cuda_bench's order checks: an all-reduce then a broadcast of the same tensor,
   is_completed() against a read without wait(), the same tensor twice in flight, a
   coalescing block, and a second group in flight from another thread (left out with
   CUDA_DEVICE_MAX_CONNECTIONS=1, where two engines are what that setting refuses);
5. compare (--compare): on 2 machines x 2 ranks and 2 x 1, fairring's engine, NCCL's
   all-reduce and Gloo's on the same tensors in the same processes, the order
   alternated each round, every result checked, NCCL's INFO lines on its transport
   quoted (one GPU time-sliced between the processes, on loopback: not a cluster);
5b. failure: rank 3 of 2 machines x 2 ranks kills itself mid-stream; each survivor's
   first error must name it within the op's timeout (20 s) and 15 s, a later broadcast
   (NCCL's on the GPU) be refused with that cause within 5 s, and its teardown return
   within 15 s;
6. bench: two processes on one GPU as two machines (benchmarks/cuda_bench.py):
   engine all-reduce throughput against fairring._C._testing.RailsEndpoint moving the same
   bytes between the same two processes, then every dtype and op checked;
6b. training: `python -m fairring.bench --study training --quick --loopback --cuda` (DDP, and FSDP2)
   (without --cuda on the CPU): tiny models trained by DDP on 2x2, fairring's losses
   against NCCL's (Gloo's) from the same weights on the same data;
7. correctness on the layouts of --worlds of one rank per machine (none by default: on one
   GPU, 4 processes take a minute, and the bench and compare stages run 2 x 1 already);
8. stress: two processes with large slices (--stress-slice) and TensorPipe's
   cuda_basic channel (FAIRRING_CHANNELS=cuda_basic), --stress-ops all-reduces of
   --stress-bytes in flight at once for --stress-rounds rounds, each result checked
   exactly. It shows whether cuda_basic's shared pool of pinned chunks (16 x 1 MiB
   per TensorPipe context) can starve the reduced-shard writes (docs/design.md);
   a hang ends at the stage's time limit, reported with the ranks' output;
9. validate: `python -m fairring.validate` (docs/validating.md) under torchrun, 2 agents as
   2 machines x 2 ranks (--share-gpu on the GPU), 1 to 16 MiB (CPU: 64 KiB to 1 MiB):
   fairring's engine, the delegate's all-reduce and (CUDA) fairring with its engine off,
   taking turns on the same tensor, every element checked; its table and verdict go in
   the report;
10. nixl: the bench's two processes on the NIXL rails (FAIRRING_RAILS_TRANSPORT=nixl),
   the GPU staging registered with UCX; skipped, saying why, where NIXL is not
   installed (carry the nixl-cu13 wheel and put it on PYTHONPATH).

Each stage runs for at most its limit less the later stages' reserves, and at
least its own reserve while the budget lasts (earlier stages first); one that
the budget no longer fits is recorded as skipped. A stage that fails is
recorded and the next one runs; the exit status is 1 if any stage failed (or no GPU is visible), else
0. --device cpu runs the same benches on CPU tensors (a smoke test for machines
without a GPU; the stress scaled down) and skips the tests.

    python -m benchmarks.gpu_check --report gpu-check-report.md
    python -m benchmarks.gpu_check --device cpu --quick --report /tmp/report.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from traceback import format_exc
from typing import Any

import torch

import fairring
from benchmarks import gpu_tools, versus_nccl
from benchmarks.cuda_bench import MAX_WORLD, check_cases, dtype_name
from fairring import _C
from fairring.bench import free_port, training
from fairring.bench.netns import netns_available
from fairring.bench.training_plots import model_name
from fairring.config import (
    CHANNELS,
    CUDA_ENGINE,
    DEFAULT_CPU_FLAT_THRESHOLD,
    DEFAULT_CUDA_FLAT_THRESHOLD,
    FLAT_THRESHOLD,
    RAILS_TRANSPORT,
    SERIALIZED_LAUNCHES,
    SLICE_SIZE,
    TOTAL_MEMORY,
    ConfigError,
    load_config,
)
from fairring.nixl import nixl_library
from fairring.sizes import format_size, parse_size

# The checkout's root: every command runs there, so `python -m benchmarks.<name>` and the in-place build import.
ROOT = Path(__file__).resolve().parents[1]
TEST_COMMAND = ["-m", "pytest", "tests/test_cuda.py", "-rs", "-s", "-p", "no:cacheprovider"]
DEFAULT_SIZES = {"cuda": "1MiB,4MiB,16MiB,64MiB,256MiB", "cpu": "1MiB,4MiB,16MiB"}
QUICK_SIZES = {"cuda": "1MiB,16MiB,64MiB", "cpu": "64KiB,1MiB"}
DEFAULT_COMPARE_SIZES = {"cuda": "1MiB,4MiB,16MiB,64MiB,256MiB", "cpu": "64KiB,1MiB,4MiB"}
QUICK_COMPARE_SIZES = {"cuda": "1MiB,16MiB,64MiB", "cpu": "64KiB,1MiB"}
DEFAULT_CHECK_SIZES = "1,1000,65537,1000003"
QUICK_CHECK_SIZES = "1,1000,65537"
# Large enough that one shard (half a slice, on two machines) fills cuda_basic's 16 MiB send
# pool, and the shards of the slices in flight exceed it; each all-reduce is 8 slices of the
# full size. The CPU smoke mode keeps that shape at an eighth of the bytes.
STRESS_SLICE = {"cuda": "32MiB", "cpu": "4MiB"}
STRESS_BYTES = {"cuda": "256MiB", "cpu": "32MiB"}
# FAIRRING_TOTAL_MEMORY for the stress, in slices: the plan stages in half of it, and a slice on
# two machines stages twice its bytes, so 16 hold FAIRRING_SLICES_IN_FLIGHT's default of 4.
STRESS_MEMORY_SLICES = 16
BENCH_WORLD = 2
# What the stages before each one leave it of the budget, and what it may take from the stages
# after it when the budget runs short: the bench needs about 120 s, the tests 100 s, the
# correctness layouts by their processes (below), the others less.
BENCH_MINIMUM_S = 120.0
# A correctness layout's time grows with its processes, which share one GPU: on an H200, 2x2 took
# 77 s, 3x2 130 s, 3 processes 41 s and 4 (one per machine) 67 s, so about 22 s a process.
WORLD_MINIMUM_PER_PROCESS_S = {"cuda": 24.0, "cpu": 8.0}
WORLD_LIMIT_PER_PROCESS_S = 30.0
# test_cuda.py: on an H200 (2026-11-28), 5 of its 9 tests, the 2x1 and 2x2 engine checks among
# them, took the stage's 100 s; the other 4 run a 2x1 or 2x2 each.
TESTS_MINIMUM_S = 200.0
COMPARE_MINIMUM_S = 45.0
# The failure stage: 2 machines x 2 ranks, the last killed; each op's timeout, and how much later than it a
# survivor may see the failure (the engine's settling, then NCCL's abort) or take to tear down.
FAILURE_STAGE = "failure: rank 3 of 2 machines x 2 ranks killed mid-stream"
FAILURE_WORLD, FAILURE_LOCAL = 4, 2
FAILURE_OP_TIMEOUT_S = 20.0
FAILURE_SLACK_S = 15.0
FAILURE_MINIMUM_S = 40.0
# After the failure, a collective of the failed group is refused with its cause, not run.
LATER_REFUSAL_S = 5.0
TRAINING_STAGE = "training: the study's quick part on 2 machines x 2 ranks"
# Three models (two DDP, one FSDP2), each on NCCL and on fairring: 60 s cut the third on an H200,
# which alone took 27 s.
TRAINING_MINIMUM_S = 100.0
STRESS_MINIMUM_S = 60.0
# A stage left less than this is skipped; writing the report takes the last few seconds.
STAGE_MINIMUM_S = 10.0
REPORT_RESERVE_S = 5.0
# Once one rank has failed, how long the others get to finish writing their results.
FAILURE_GRACE_S = 15.0
# Once every rank has written all of its results, how long they get to tear down and exit.
TEARDOWN_GRACE_S = 30.0
TAIL_CHARS = 12_000
TESTS_STAGE = "tests: tests/test_cuda.py"
BENCH_STAGE = f"bench: {BENCH_WORLD} processes as {BENCH_WORLD} machines"
STRESS_STAGE = "stress: cuda_basic, large slices"
NIXL_STAGE = f"nixl: {BENCH_WORLD} processes as {BENCH_WORLD} machines on the NIXL rails"
NIXL_SIZES = {"cuda": "16MiB,64MiB", "cpu": "1MiB"}
NIXL_MINIMUM_S = 45.0
VALIDATE_STAGE = "validate: fairring.validate on 2 machines x 2 ranks"
# -b and -e of the validate stage: a small sweep, as the stage's time limit allows.
VALIDATE_SIZES = {"cuda": ("1MiB", "16MiB"), "cpu": ("64KiB", "1MiB")}
VALIDATE_MACHINES, VALIDATE_LOCAL = 2, 2
VALIDATE_MINIMUM_S = 30.0


def parse_layout(spec: str) -> tuple[int, int]:
    """ "4" (4 machines of one rank) or "2x2" (2 machines of 2 ranks): (machines, ranks per machine)."""
    machines, _, local = spec.strip().partition("x")
    return int(machines), int(local or 1)


def world_stage(spec: str) -> str:
    machines, local = parse_layout(spec)
    if local == 1:
        return f"correctness: {machines} processes as {machines} machines"
    return f"correctness: {machines * local} processes as {machines} machines x {local} ranks"


def as_users_run(args: argparse.Namespace, spec: str) -> dict[str, str]:
    """The first layout with local steps runs as a Megatron-style job would: the GPU in launch order
    (CUDA_DEVICE_MAX_CONNECTIONS=1) and the default flat threshold, so that NCCL's own all-reduces
    of the small cases are launched among the engine's; the others run the engine at every size.
    The engine is kept there (FAIRRING_SERIALIZED_LAUNCHES=engine): the check runs one group's
    collectives at a time, which is what that setting vouches for."""
    first = next((other for other in args.world_list if parse_layout(other)[1] > 1), None)
    if spec != first:
        return {}
    default = DEFAULT_CUDA_FLAT_THRESHOLD if args.device == "cuda" else DEFAULT_CPU_FLAT_THRESHOLD
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1", SERIALIZED_LAUNCHES: "engine", FLAT_THRESHOLD: str(default)}


def compare_stage(spec: str) -> str:
    machines, local = parse_layout(spec)
    return f"compare: fairring, NCCL, Gloo on {machines} machines x {local} ranks"


@dataclass
class Stage:
    name: str
    status: str = "skipped"  # ok, failed, skipped
    seconds: float = 0.0
    detail: str = ""
    commands: list[str] = field(default_factory=list)
    output_tail: str = ""


@dataclass
class Finished:
    returncode: int | None  # None: killed at its time limit
    output: str
    seconds: float


@dataclass
class Step:
    """A stage to run: at most `limit` seconds; the stages before it leave it `reserve` seconds."""

    name: str
    limit: float
    reserve: float
    run: Callable[[float], tuple[Stage, dict[str, Any]]]
    skip: str = ""  # why it does not run at all, whatever the budget


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--report", type=Path, default=Path("gpu-check-report.md"), help="the report (Markdown)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke mode on CPU tensors")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and iterations")
    parser.add_argument("--sizes", help="throughput sizes, e.g. 1MiB,4MiB (default by --device and --quick)")
    parser.add_argument("--check-sizes", help=f"correctness sizes in elements (default {DEFAULT_CHECK_SIZES})")
    parser.add_argument("-n", "--iters", type=int, help="timed iterations per size (default 10, quick 3)")
    parser.add_argument("-w", "--warmup", type=int, help="untimed iterations first (default 3, quick 1)")
    parser.add_argument("--tests", choices=("auto", "run", "skip"), default="auto", help="auto: run with --device cuda")
    parser.add_argument("--tests-timeout", type=float, default=300.0, help="seconds for the tests (default 300)")
    parser.add_argument("--bench-timeout", type=float, default=240.0, help="seconds for the bench (default 240)")
    parser.add_argument(
        "--worlds",
        default="2x2,3x2",
        help="layouts of the correctness stages: N (N machines of one rank) or MxL (default 2x2,3x2)",
    )
    parser.add_argument("--compare", default="2x2,2x1", help="layouts of the compare stages, MxL ('' for none)")
    parser.add_argument("--compare-sizes", help="compare sizes (default 1MiB,...,256MiB; cpu 64KiB,1MiB)")
    parser.add_argument("--compare-timeout", type=float, default=150.0, help="seconds for the comparison")
    parser.add_argument("--failure-timeout", type=float, default=90.0, help="seconds for the failure stage")
    parser.add_argument("--training-timeout", type=float, default=150.0, help="seconds for the training stage")
    parser.add_argument(
        "--versus-timeout", type=float, default=240.0, help="seconds for the stage against NCCL (default 240)"
    )
    parser.add_argument(
        "--worlds-timeout", type=float, help=f"seconds for each (default {WORLD_LIMIT_PER_PROCESS_S:.0f} per process)"
    )
    parser.add_argument("--stress-slice", help="stress: FAIRRING_SLICE_SIZE (default 32MiB, cpu 4MiB)")
    parser.add_argument("--stress-bytes", help="stress: bytes of each all-reduce (default 256MiB, cpu 32MiB)")
    parser.add_argument("--stress-ops", type=int, default=4, help="stress: all-reduces in flight at once (default 4)")
    parser.add_argument("--stress-rounds", type=int, default=4, help="stress: rounds (default 4; 0: no stress)")
    parser.add_argument("--stress-timeout", type=float, default=120.0, help="seconds for the stress (default 120)")
    parser.add_argument("--nixl-timeout", type=float, default=120.0, help="seconds for the NIXL stage (default 120)")
    parser.add_argument("--validate-timeout", type=float, default=150.0, help="seconds for the validate stage")
    parser.add_argument("--op-timeout", type=float, default=60.0, help="seconds any one wait in the bench may take")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for every stage together (default 540)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="VAR=VALUE", help="environment for every stage's ranks"
    )
    parser.add_argument("--build-log", type=Path, help="the build's output, for the report (make gpu-check)")
    parser.add_argument("--build-seconds", type=float, help="how long the build took (make gpu-check)")
    parser.add_argument("--build-command", default="", help="the build's command line (make gpu-check)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.iters = args.iters if args.iters is not None else 3 if quick else 10
    args.warmup = args.warmup if args.warmup is not None else 1 if quick else 3
    args.compare_iters = 3 if quick else 5
    sizes = args.sizes or (QUICK_SIZES if quick else DEFAULT_SIZES)[args.device]
    check_sizes = args.check_sizes or (QUICK_CHECK_SIZES if quick else DEFAULT_CHECK_SIZES)
    try:
        args.size_list = [parse_size("--sizes", text.strip()) for text in sizes.split(",")]
        args.check_size_list = [int(text.strip()) for text in check_sizes.split(",")]
        args.world_list = [text.strip() for text in args.worlds.split(",") if text.strip()]
        args.compare_list = [text.strip() for text in args.compare.split(",") if text.strip()]
        layouts = [parse_layout(spec) for spec in [*args.world_list, *args.compare_list]]
        compare_sizes = args.compare_sizes or (QUICK_COMPARE_SIZES if quick else DEFAULT_COMPARE_SIZES)[args.device]
        args.compare_size_list = [parse_size("--compare-sizes", text.strip()) for text in compare_sizes.split(",")]
        args.stress_slice = parse_size("--stress-slice", args.stress_slice or STRESS_SLICE[args.device])
        args.stress_bytes = parse_size("--stress-bytes", args.stress_bytes or STRESS_BYTES[args.device])
    except (ConfigError, ValueError) as error:
        parser.error(str(error))
    if any(size % 8 for size in args.size_list) or min(args.check_size_list) < 1:
        parser.error("--sizes must be multiples of 8 bytes and --check-sizes at least 1 element")
    if any(machines < 2 or local < 1 or not 2 <= machines * local <= MAX_WORLD for machines, local in layouts):
        parser.error(f"--worlds and --compare take 2+ machines of 2 to {MAX_WORLD} processes in all")
    if args.stress_bytes % 4 or args.stress_ops < 1 or args.stress_rounds < 0:
        parser.error("--stress-bytes must be a multiple of 4, --stress-ops >= 1 and --stress-rounds >= 0")
    if args.iters < 1 or args.warmup < 0:
        parser.error("--iters must be >= 1 and --warmup >= 0")
    if any("=" not in assignment for assignment in args.set):
        parser.error("--set takes VAR=VALUE")
    return args


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    text = text if len(text) <= limit else "[...]\n" + text[-limit:]
    return text.replace("```", "'''")  # keeps the report's code blocks intact


def run_command(command: list[str], env: dict[str, str] | None, output: Path) -> subprocess.Popen[bytes]:
    """Starts `command` in its own session (so that it can be killed with everything it started)."""
    with open(output, "wb") as sink:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def run_bounded(command: list[str], timeout: float, env: dict[str, str] | None = None) -> Finished:
    """Runs `command` to its end or for `timeout` seconds; its output (stdout and stderr)."""
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "output"
        start = time.monotonic()
        process = run_command(command, env, log)
        try:
            returncode: int | None = process.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            kill(process)
        return Finished(returncode, log.read_text(errors="replace"), time.monotonic() - start)


def display(command: list[str]) -> str:
    return shlex.join(["python" if part == sys.executable else part for part in command])


def nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # a CPU build of torch has no NCCL
        return None
    return ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)


def version_line(command: list[str], last: bool = False) -> str:
    """A tool's version line (its first, or its last), "none" where it is missing, never an exception."""
    if shutil.which(command[0]) is None:
        return "none"
    finished = run_bounded(command, 30)
    lines = finished.output.strip().splitlines()
    if finished.returncode != 0 or not lines:
        return f"failed: {finished.output.strip()[:200]}"
    return lines[-1] if last else lines[0]


def environment() -> dict[str, Any]:
    # make gpu-check exports CXX and the CUDA_HOME it derived from nvcc, and built with them.
    compiler = shlex.split(os.environ.get("CXX") or "c++")
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "cpus": os.cpu_count(),
        "nproc": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_home": os.environ.get("CUDA_HOME") or "none",
        "compiler": f"{shlex.join(compiler)}: {version_line([*compiler, '--version'])}",
        "nvcc": version_line(["nvcc", "--version"], last=True),
        "nccl": nccl_version(),
        "fairring": fairring.__version__,
        "fairring_build": fairring.build_info(),
        "cuda_available": torch.cuda.is_available(),
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "environment": {k: v for k, v in os.environ.items() if k.startswith(("FAIRRING_", "CUDA", "NCCL_", "TP_"))},
    }
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_mode", "--format=csv,noheader"]
        finished = run_bounded(query, 30)
        info["nvidia_smi"] = finished.output.strip() if finished.returncode == 0 else f"failed: {finished.output}"
    return info


def gpu_names() -> list[str]:
    """Called after the stages, so that this process holds no CUDA context while they run."""
    try:
        return [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
    except Exception as error:
        return [f"unavailable: {error}"]


def pytest_summary(output: str) -> str:
    """pytest's last line, e.g. '2 passed, 1 skipped in 80.1s'."""
    for line in reversed(output.splitlines()):
        match = re.fullmatch(r"=+ (.*\bin [\d.]+s.*?) =+", line.strip())
        if match:
            return match.group(1)
    return "no pytest summary line (killed, or it did not start)"


def run_tests(args: argparse.Namespace, timeout: float) -> Stage:
    command = [sys.executable, *TEST_COMMAND]
    stage = Stage(TESTS_STAGE, commands=[display(command)])
    print(f"gpu-check: {display(command)} (at most {timeout:.0f} s)", flush=True)
    finished = run_bounded(command, timeout)
    summary = pytest_summary(finished.output)
    passed = re.search(r"\b(\d+) passed\b", summary)
    stage.seconds, stage.output_tail = finished.seconds, tail(finished.output)
    if finished.returncode is None:
        stage.status, stage.detail = "failed", f"killed after {timeout:.0f} s; {summary}"
    elif finished.returncode != 0:
        stage.status, stage.detail = "failed", f"exit code {finished.returncode}; {summary}"
    elif args.device == "cuda" and not passed:
        # With a GPU visible, the one-GPU tests must run, not skip.
        stage.status, stage.detail = "failed", f"no test passed; {summary}"
    else:
        stage.status, stage.detail = "ok", f"exit code 0; {summary}"
    return stage


def rank_command(args: argparse.Namespace, world: int, rank: int, port: int, out: Path, phases: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "benchmarks.cuda_bench", "--rank", str(rank), "--world", str(world),
        "--port", str(port), "--device", args.device, "--op-timeout", str(args.op_timeout), *phases,
        "--out", str(out),
    ]  # fmt: skip


# NCCL takes each process for a host of its own (NCCL_HOSTID), so it accepts several on the one GPU,
# and connects them with its socket transport on loopback; NVLink SHARP and multi-node NVLink off.
# NCCL's INFO lines (NCCL_DEBUG=INFO) that say which transport and interface it uses.
NCCL_TRANSPORT_LINE = re.compile(r"NCCL INFO ((?:Using network|NET/\w+ : Using|NCCL version) [^\n]*)")
# The rank settings a report's commands show.
SHOWN_SETTINGS = ("FAIRRING_", "TP_", "NCCL_", "CUDA_")
NCCL_ON_ONE_GPU = {
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_IB_DISABLE": "1",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_MNNVL_ENABLE": "0",
}


def rank_settings(
    args: argparse.Namespace, world: int, rank: int, port: int, extra: dict[str, str], local: int = 1
) -> dict[str, str]:
    """The rank's environment on top of this process's; `extra` (a stage's own) wins over --set."""
    return {
        # Machines of `local` processes; all share this host, so every path stays on loopback.
        "FAIRRING_MACHINE_ID": f"machine-{rank // local}",
        "NCCL_HOSTID": f"fairring-gpu-check-{rank}",
        **NCCL_ON_ONE_GPU,
        "TP_SOCKET_IFNAME": "lo",
        "GLOO_SOCKET_IFNAME": "lo",
        CUDA_ENGINE: "1",
        # The engine at every size, to check it there: by default small CUDA all-reduces go to NCCL.
        FLAT_THRESHOLD: "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        **dict(assignment.split("=", 1) for assignment in args.set),
        **extra,
    }


def wait_ranks(
    ranks: list[subprocess.Popen[bytes]], timeout: float, out: Path, victim: int | None = None
) -> tuple[list[int | None], str]:
    """Exit codes (None: killed); why they were killed, if they were. `victim` is meant to die."""
    deadline = time.monotonic() + timeout
    first_failure: float | None = None
    finished: float | None = None
    others = [r for r in range(len(ranks)) if r != victim]
    while any(rank.poll() is None for rank in ranks):
        now = time.monotonic()
        if first_failure is None and any(ranks[r].returncode not in (None, 0) for r in others):
            first_failure = now
        if finished is None and all((out / f"rank{r}.finished").exists() for r in others):
            finished = now
        if now > deadline:
            why = f"killed after {timeout:.0f} s"
            break
        if first_failure is not None and now - first_failure > FAILURE_GRACE_S:
            why = f"killed {FAILURE_GRACE_S:.0f} s after a rank failed"
            break
        if finished is not None and now - finished > TEARDOWN_GRACE_S:
            why = f"killed: hung in teardown for {TEARDOWN_GRACE_S:.0f} s after writing every result"
            break
        time.sleep(0.2)
    else:
        why = ""
    codes = [rank.poll() for rank in ranks]
    for rank in ranks:
        kill(rank)
    return codes, why


def run_ranks(
    args: argparse.Namespace,
    stage: Stage,
    world: int,
    phases: list[str],
    extra: dict[str, str],
    timeout: float,
    local: int = 1,
    victim: int | None = None,
) -> tuple[dict[int, dict[str, Any] | None], list[str]]:
    """Runs `world` cuda_bench ranks for `stage`, on machines of `local` ranks: each rank's results, and
    what went wrong around them (killed, exit codes). Fills in the stage's commands, time and output."""
    port = free_port()
    results: dict[int, dict[str, Any] | None] = {}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        settings = [rank_settings(args, world, rank, port, extra, local) for rank in range(world)]
        commands = [rank_command(args, world, rank, port, out, phases) for rank in range(world)]
        shown = [{k: v for k, v in env.items() if k.startswith(SHOWN_SETTINGS)} for env in settings]
        stage.commands = [
            " ".join([*(f"{k}={v}" for k, v in env.items()), display(command)])
            for env, command in zip(shown, commands, strict=True)
        ]
        print(f"gpu-check: {stage.name}, {world} ranks (at most {timeout:.0f} s)", flush=True)
        start = time.monotonic()
        ranks = []
        try:
            for rank, command in enumerate(commands):
                env = {**os.environ, **settings[rank]}
                ranks.append(run_command(command, env, out / f"rank{rank}.log"))
            codes, why = wait_ranks(ranks, timeout, out, victim)
        finally:
            for process in ranks:
                kill(process)
        stage.seconds = time.monotonic() - start
        logs = []
        for rank in range(world):
            results[rank] = read_results(out / f"rank{rank}.json")
            full = (out / f"rank{rank}.log").read_text(errors="replace")
            if results[rank] is not None:
                # Where the stage asked NCCL for its INFO lines: what it connected through.
                results[rank]["nccl_info"] = sorted(set(NCCL_TRANSPORT_LINE.findall(full)))[:8]
            log = tail(full, 6000)
            ended = "killed" if codes[rank] is None else f"exit code {codes[rank]}"
            logs.append(f"--- rank {rank} ({ended}) ---\n{log}")
        stage.output_tail = "\n".join(logs)
    problems = [why] if why else []
    problems += [
        f"rank {r} exited with code {code}" for r, code in enumerate(codes) if code not in (0, None) and r != victim
    ]
    if victim is not None and codes[victim] != -signal.SIGKILL:
        problems.append(f"rank {victim}, meant to kill itself, ended with {codes[victim]}")
    return results, problems


def conclude(stage: Stage, summary: dict[str, Any], problems: list[str], passed: str) -> tuple[Stage, dict[str, Any]]:
    """The stage's verdict from the problems around the ranks, then those in their results."""
    summary["problems"] = problems + summary["problems"]
    stage.status = "failed" if summary["problems"] else "ok"
    stage.detail = "; ".join(summary["problems"][:6]) or passed
    return stage, summary


def check_phases(args: argparse.Namespace) -> list[str]:
    return ["--check-sizes", ",".join(str(n) for n in args.check_size_list), "--order-checks"]


def bench_phases(args: argparse.Namespace, sizes: list[int]) -> list[str]:
    """The bench's phases: throughput at `sizes`, then the correctness checks."""
    return [
        "--sizes", ",".join(str(s) for s in sizes), *check_phases(args),
        "--iters", str(args.iters), "--warmup", str(args.warmup),
    ]  # fmt: skip


def run_bench(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    stage = Stage(BENCH_STAGE)
    phases = bench_phases(args, args.size_list)
    ranks, problems = run_ranks(args, stage, BENCH_WORLD, phases, {}, timeout)
    return conclude(stage, summarize(ranks, args, args.size_list), problems, "all results correct")


def run_nixl(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    """The engine over the NIXL rails (GPU staging registered with UCX where --device cuda)."""
    stage = Stage(NIXL_STAGE)
    sizes = [parse_size("--sizes", text) for text in NIXL_SIZES[args.device].split(",")]
    phases = bench_phases(args, sizes)
    ranks, problems = run_ranks(args, stage, BENCH_WORLD, phases, {RAILS_TRANSPORT: "nixl"}, timeout)
    return conclude(stage, summarize(ranks, args, sizes), problems, "all results correct")


def why_no_nixl() -> str:
    """Why the NIXL stage cannot run here; "" where it can."""
    try:
        nixl_library()
    except ConfigError as error:
        return f"skipped: {error}"
    return ""


def as_an_nccl_job(args: argparse.Namespace, spec: str) -> bool:
    """The second layout with local steps starts as a job set up for NCCL does (cuda_bench's
    --as-nccl-job: ProcessGroupNCCL.Options as pg_options, device_id), so those reach real NCCL
    groups; the first keeps fairring's defaults."""
    local_layouts = [other for other in args.world_list if parse_layout(other)[1] > 1]
    return len(local_layouts) > 1 and spec == local_layouts[1]


def run_world(args: argparse.Namespace, spec: str, timeout: float) -> tuple[Stage, dict[str, Any]]:
    nccl_job = as_an_nccl_job(args, spec)
    stage = Stage(world_stage(spec) + (", as an NCCL job starts (pg_options, device_id)" if nccl_job else ""))
    machines, local = parse_layout(spec)
    extra = as_users_run(args, spec)
    phases = check_phases(args) + (["--as-nccl-job"] if nccl_job else [])
    ranks, problems = run_ranks(args, stage, machines * local, phases, extra, timeout, local)
    summary = summarize(ranks, args, [])
    return conclude(stage, summary, problems, f"all {summary['correctness']['planned_per_rank']} cases correct")


def run_failure(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    """Rank 3 of 2x2 killed mid-stream: each survivor names it within its timeout, then tears down."""
    stage = Stage(FAILURE_STAGE)
    victim = FAILURE_WORLD - 1
    phases = ["--kill-rank", str(victim), "--op-timeout", str(FAILURE_OP_TIMEOUT_S)]
    ranks, problems = run_ranks(
        args, stage, FAILURE_WORLD, phases, {FLAT_THRESHOLD: "0"}, timeout, FAILURE_LOCAL, victim
    )
    outcomes = {rank: (result or {}).get("failure", {}) for rank, result in ranks.items() if rank != victim}
    for rank, outcome in outcomes.items():
        if not outcome:
            problems.append(f"rank {rank} recorded no failure")
            continue
        if not outcome.get("names_victim"):
            problems.append(f"rank {rank}'s error does not name rank {victim}: {str(outcome.get('first'))[:300]}")
        if outcome.get("seconds", float("inf")) > FAILURE_OP_TIMEOUT_S + FAILURE_SLACK_S:
            problems.append(f"rank {rank} saw the failure after {outcome.get('seconds')} s")
        later = str(outcome.get("later_broadcast"))
        if later == "completed" or outcome.get("later_broadcast_seconds", float("inf")) > LATER_REFUSAL_S:
            problems.append(
                f"rank {rank}'s later broadcast was not refused at once "
                f"({outcome.get('later_broadcast_seconds')} s): {later[:300]}"
            )
        if outcome.get("destroy_seconds", float("inf")) > FAILURE_SLACK_S or "destroy_error" in outcome:
            problems.append(
                f"rank {rank}'s teardown: {outcome.get('destroy_seconds')} s, {outcome.get('destroy_error')}"
            )
    summary = {"victim": victim, "outcomes": outcomes, "problems": []}
    return conclude(
        stage, summary, problems, f"every survivor named rank {victim}, refused a later broadcast and tore down"
    )


def run_fairring_bench(stage: Stage, arguments: list[str], timeout: float) -> tuple[list[dict[str, Any]], list[str]]:
    """`python -m fairring.bench <arguments>` for `stage`, at most `timeout` s: its records, and what
    went wrong around them. Fills in the stage's command, time and output."""
    problems: list[str] = []
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "records.json"
        command = [sys.executable, "-m", "fairring.bench", *arguments, "--json", str(path), "--plots", scratch]
        stage.commands = [display(command)]
        print(f"gpu-check: {display(command)} (at most {timeout:.0f} s)", flush=True)
        log = Path(scratch) / "output"
        started = time.monotonic()
        process = run_command(command, None, log)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            problems.append(f"killed after {timeout:.0f} s")
            process.terminate()  # the bench stops its torchrun agents, which run in sessions of their own
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=20)
        finally:
            kill(process)
        stage.seconds, stage.output_tail = time.monotonic() - started, tail(log.read_text(errors="replace"))
        if process.returncode not in (0, None) and not problems:
            problems.append(f"exit code {process.returncode}")
        if path.exists():
            records = json.loads(path.read_text())["records"]
    return records, problems


def run_training(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    """The training study's quick part: tiny models trained by DDP (and the transformer by FSDP2) on 2x2,
    fairring against the baseline (NCCL on a GPU, Gloo on the CPU) from the same weights on the same data."""
    stage = Stage(TRAINING_STAGE)
    arguments = ["--study", "training", "--quick", "--loopback", *(["--cuda"] if args.device == "cuda" else [])]
    records, problems = run_fairring_bench(stage, arguments, timeout)
    fairring_records = [record for record in records if record["backend"] == "fairring"]
    runs = len(training.QUICK_RUNS)
    if len(fairring_records) != runs or len(records) != 2 * runs:
        problems.append(
            f"{len(records)} records, {len(fairring_records)} of them fairring's (expected {2 * runs}, {runs})"
        )
    for record in fairring_records:
        # fp32 to 1e-5 relative, bf16 autocast to 1e-2, as the study's own reading.
        tolerance = 1e-2 if record["autocast"] else 1e-5
        name = model_name(record)
        if record.get("loss_gap") is None or record["loss_gap"] >= tolerance:
            problems.append(f"{name}: loss gap {record.get('loss_gap')} against {record.get('baseline')}")
        if not record.get("engine_all_reduces"):
            problems.append(f"{name}: no collective went to the engine")
    rows = [
        {
            "model": model_name(record),
            **{key: record.get(key) for key in ("backend", "median_s", "speedup_vs_baseline", "loss_gap")},
        }
        for record in records
    ]
    return conclude(stage, {"rows": rows, "problems": []}, problems, "losses agree with the baseline's")


def run_versus(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    """The engine, NCCL (Gloo) and auto's routing on hosts whose NICs are shaped, MPS where it starts
    (benchmarks/versus_nccl.py): 2x2, then 2x4 where the time allows (not with --quick)."""
    stage = Stage(versus_nccl.STAGE)
    available, reason = netns_available()
    summary: dict[str, Any] = {
        "device": args.device,
        "netns": "available" if available else f"unavailable: {reason}",
        "layouts": {},
    }
    problems: list[str] = []
    started = time.monotonic()
    mps = versus_nccl.start_mps(args.device)
    summary["mps"] = mps.state
    print(f"gpu-check: MPS: {mps.state}", flush=True)
    try:
        first_s = None
        for machines, local in versus_nccl.LAYOUTS[: 1 if args.quick else None]:
            layout = f"{machines}x{local}"
            left = timeout - (time.monotonic() - started)
            if first_s is not None and left < 2.2 * first_s:
                summary["left_out"] = f"{layout} left out: {left:.0f} s of the stage left, {first_s:.0f} s for 2x2"
                break
            sizes = (versus_nccl.QUICK_SIZES if args.quick else versus_nccl.SIZES)[args.device]
            arguments = versus_nccl.bench_arguments(machines, local, sizes, args.compare_iters, mps)
            records, found, seconds = run_versus_part(stage, arguments, left, layout, 3 * len(sizes.split(",")))
            first_s = first_s or seconds
            problems += found
            summary["layouts"][layout] = versus_nccl.summarize(records, machines, local)
            if layout == "2x2":
                # DDP's buckets back to back: the engine against the baseline.
                arguments = versus_nccl.overlap_arguments(args.device, args.compare_iters, mps)
                left = timeout - (time.monotonic() - started)
                records, found, _ = run_versus_part(stage, arguments, left, "buckets", 2)
                problems += found
                keys = ("backend", "median_s", "speedup_vs_baseline", "fraction_of_bound_speed", "correct")
                what = f"{versus_nccl.BUCKETS} all-reduces of {versus_nccl.BUCKET_SIZE[args.device]} issued at once"
                summary["overlap"] = {"what": what, "rows": [{key: r.get(key) for key in keys} for r in records]}
                # FSDP's collectives, each about half an all-reduce's time, where the stage has it.
                for collective in ("reduce_scatter", "all_gather"):
                    left = timeout - (time.monotonic() - started)
                    if left < first_s:
                        summary.setdefault("left_out", f"{collective} left out: {left:.0f} s of the stage left")
                        continue
                    arguments = versus_nccl.bench_arguments(machines, local, sizes, args.compare_iters, mps, collective)
                    expected = 3 * len(sizes.split(","))
                    records, found, _ = run_versus_part(stage, arguments, left, collective, expected)
                    problems += found
                    summary.setdefault("fsdp", {})[collective] = versus_nccl.summarize(records, machines, local)
    finally:
        stopped = versus_nccl.stop_mps(mps)
        if stopped:
            summary["mps"] += f"; {stopped} after the stage"
    stage.seconds = time.monotonic() - started
    stage.output_tail = tail(stage.output_tail)
    return conclude(stage, {**summary, "problems": []}, problems, "every result correct")


def run_versus_part(
    stage: Stage, arguments: list[str], timeout: float, label: str, expected: int
) -> tuple[list[dict[str, Any]], list[str], float]:
    """One bench run of the versus stage, its commands and output added to the stage's: its records,
    what went wrong (labelled), and its seconds."""
    part = Stage(stage.name)
    records, found = run_fairring_bench(part, arguments, timeout)
    stage.commands += part.commands
    stage.output_tail += part.output_tail
    problems = [f"{label}: {problem}" for problem in found]
    problems += [
        f"{label}: {r['backend']} at {format_size(int(r['bytes']))} gave wrong results"
        for r in records
        if not r["correct"]
    ]
    if len(records) != expected:
        problems.append(f"{label}: {len(records)} records of {expected}")
    return records, problems, part.seconds


def validate_agent(args: argparse.Namespace, node: int, port: int, out: Path) -> list[str]:
    """One torchrun agent (a machine) of the validate stage."""
    first, last = VALIDATE_SIZES[args.device]
    return [
        sys.executable, "-m", "torch.distributed.run", f"--nnodes={VALIDATE_MACHINES}", f"--node-rank={node}",
        f"--nproc-per-node={VALIDATE_LOCAL}", "--master-addr=127.0.0.1", f"--master-port={port}",
        "-m", "fairring.validate", "--device", args.device, "-b", first, "-e", last, "-f", "4",
        "-n", str(args.compare_iters), "-w", "1", "--json", str(out),
        *(["--share-gpu"] if args.device == "cuda" else []),
    ]  # fmt: skip


def wait_agents(agents: list[subprocess.Popen[bytes]], timeout: float) -> tuple[list[int | None], str]:
    """Exit codes (None: killed at the limit). Killing an agent ends its ranks: they die with it."""
    deadline = time.monotonic() + timeout
    why = ""
    for agent in agents:
        try:
            agent.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            why = f"killed after {timeout:.0f} s"
            break
    codes = [agent.poll() for agent in agents]
    for agent in agents:
        kill(agent)
    return codes, why


def run_validate(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    """`python -m fairring.validate` as a cluster runs it: torchrun, one agent per (emulated) machine."""
    stage = Stage(VALIDATE_STAGE)
    port = free_port()
    settings = {**NCCL_ON_ONE_GPU, "TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    settings.update(assignment.split("=", 1) for assignment in args.set)
    env = {**os.environ, **settings}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "validate.json"
        commands = [validate_agent(args, node, port, out) for node in range(VALIDATE_MACHINES)]
        shown = " ".join(f"{name}={value}" for name, value in settings.items())
        stage.commands = [f"{shown} {display(command)}" for command in commands]
        print(f"gpu-check: {stage.name} (at most {timeout:.0f} s)", flush=True)
        logs = [Path(scratch) / f"agent{node}.log" for node in range(VALIDATE_MACHINES)]
        started = time.monotonic()
        agents = []
        try:
            agents = [run_command(command, env, log) for command, log in zip(commands, logs, strict=True)]
            codes, why = wait_agents(agents, timeout)
        finally:
            for agent in agents:
                kill(agent)
        stage.seconds = time.monotonic() - started
        outputs = [log.read_text(errors="replace") for log in logs]
        stage.output_tail = "\n".join(
            f"--- machine {node} (exit code {code}) ---\n{tail(output, 6000)}"
            for node, (code, output) in enumerate(zip(codes, outputs, strict=True))
        )
        document = read_results(out)
    problems = [why] if why else []
    problems += [f"machine {node}'s agent exited with code {code}" for node, code in enumerate(codes) if code]
    summary = summarize_validate(document, args.device)
    return conclude(stage, summary, problems, "every element right; " + summary.get("verdict", ""))


def summarize_validate(document: dict[str, Any] | None, device: str) -> dict[str, Any]:
    """The validate run's results by path and size, its verdict, and what is wrong with them."""
    if document is None:
        return {"problems": ["fairring.validate wrote no results"]}
    expected = {"fairring", "nccl", "fairring-engine-off"} if device == "cuda" else {"fairring", "gloo"}
    problems = [] if set(document["paths"]) == expected else [f"paths {sorted(document['paths'])}"]
    if document["wrong"]:
        problems.append(f"{document['wrong']} wrong element(s)")
    return {
        "device": device,
        "paths": {name: path["results"] for name, path in document["paths"].items()},
        "comparison": document["comparison"],
        "bound_note": document["bound_note"],
        "rails": document["rails"],
        "engine_stats": document["engine_stats"],
        "verdict": document["verdict"]["text"],
        "problems": problems,
    }


def validate_lines(summary: dict[str, Any]) -> list[str]:
    paths, comparison = summary.get("paths", {}), summary.get("comparison", [])
    if not paths:
        return ["Not run."]
    lines = [
        "`python -m fairring.validate` under torchrun, 2 agents as 2 machines x 2 ranks: the paths take turns on",
        "the same tensor, median of the slower rank; every element checked (#wrong). Every machine is on this host:",
        "this compares code paths, not a cluster"
        + (" (one GPU time-sliced between the processes, --share-gpu)." if summary["device"] == "cuda" else "."),
        "",
    ]
    names = list(paths)
    header = ["size", *(f"{name} us" for name in names), *(f"{name} busbw GB/s" for name in names)]
    header += [f"vs {names[1]}", "of bound", "#wrong"]
    body = []
    for index, row in enumerate(comparison):
        results = [paths[name][index] for name in names]
        body.append([
            format_size(row["bytes"]), *(f"{result['time_us']:.1f}" for result in results),
            *(f"{result['busbw_GBps']:.3f}" for result in results), f"{row['engine_vs_delegate']:.2f}x",
            percent(row["of_bound"]), sum(result["wrong"] for result in results),
        ])  # fmt: skip
    lines += table(header, body)
    return [*lines, "", f"Bound: {summary['bound_note']}.", "", f"Verdict: {summary['verdict']}"]


def why_no_netns() -> str:
    available, reason = netns_available()
    if available:
        return ""
    if "is not installed" in reason:  # the GPU machine's image has no iproute2 and no network
        reason += f"; run `make gpu-tools` where the network is and carry {gpu_tools.FOLDER.name}"
    return f"skipped: {reason}"


def run_compare(args: argparse.Namespace, spec: str, timeout: float) -> tuple[Stage, dict[str, Any]]:
    stage = Stage(compare_stage(spec))
    machines, local = parse_layout(spec)
    phases = [
        "--compare-sizes", ",".join(str(size) for size in args.compare_size_list), "--compare-gloo",
        "--iters", str(args.compare_iters), "--warmup", "1",
    ]  # fmt: skip
    nccl_info = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    ranks, problems = run_ranks(args, stage, machines * local, phases, nccl_info, timeout, local)
    summary = summarize_compare(ranks, args, spec)
    summary["nccl_info"] = (ranks.get(0) or {}).get("nccl_info", [])
    if args.device == "cuda" and not any("Using network" in line for line in summary["nccl_info"]):
        problems.append("NCCL said nothing of its network: its INFO lines are missing")
    return conclude(stage, summary, problems, "every result correct")


def stress_plan(args: argparse.Namespace, settings: dict[str, str]) -> dict[str, Any]:
    """The engine's plan of one stress all-reduce on two machines of one rank (as fairring.plan_log.plan_of)."""
    config = load_config({**os.environ, **settings})
    return _C.plan_shape(
        numel=args.stress_bytes // 4,
        element_size=4,
        local_size=1,
        machines=BENCH_WORLD,
        transport_min_shard_bytes=_C.CUDA_MIN_SHARD_BYTES if args.device == "cuda" else 1,
        max_slice_bytes=config.slice_size,
        min_shard_bytes=config.min_shard,
        total_memory_bytes=config.total_memory,
        max_slices_in_flight=config.slices_in_flight,
    )


def run_stress(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    stage = Stage(STRESS_STAGE)
    extra = {
        SLICE_SIZE: format_size(args.stress_slice),
        TOTAL_MEMORY: format_size(args.stress_slice * STRESS_MEMORY_SLICES),
        # Requires cuda_basic for CUDA buffers (and leaves out cuda_gdr); CPU buffers keep basic.
        CHANNELS: "cuda_basic",
    }
    phases = [
        "--stress-ops", str(args.stress_ops), "--stress-bytes", str(args.stress_bytes),
        "--stress-rounds", str(args.stress_rounds),
    ]  # fmt: skip
    ranks, problems = run_ranks(args, stage, BENCH_WORLD, phases, extra, timeout)
    summary = summarize_stress(ranks, args)
    summary["settings"] = extra
    summary["plan"] = stress_plan(args, rank_settings(args, BENCH_WORLD, 0, 0, extra))
    planned = args.stress_ops * args.stress_rounds
    return conclude(stage, summary, problems, f"all {planned} all-reduces correct on every rank")


def read_results(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def rank_problems(rank: int, result: dict[str, Any] | None) -> list[str]:
    if result is None:
        return [f"rank {rank} wrote no results"]
    problems = [f"rank {rank}: {error['where']} failed" for error in result.get("errors", [])]
    return problems + ([] if result.get("done") else [f"rank {rank} did not finish"])


def summarize(ranks: dict[int, dict[str, Any] | None], args: argparse.Namespace, sizes: list[int]) -> dict[str, Any]:
    """What the report shows: rank 0's timings at `sizes` (the slower rank's), every rank's checks."""
    problems: list[str] = []
    planned = len(check_cases(args.device)) * len(args.check_size_list)
    failed_cases: list[dict[str, Any]] = []
    for rank, result in ranks.items():
        problems += rank_problems(rank, result)
        if result is None:
            continue
        cases = result.get("correctness", {}).get("cases", [])
        failed_cases += [{"rank": rank, **case} for case in cases if not case.get("ok")]
        if len(cases) != planned:
            problems.append(f"rank {rank} checked {len(cases)} of {planned} correctness cases")
    if failed_cases:
        problems.append(f"{len(failed_cases)} correctness case(s) failed")
    order = {rank: (result or {}).get("order", {}) for rank, result in ranks.items()}
    for rank, checks in order.items():
        for name, check in checks.items():
            if not check.get("ok"):
                problems.append(f"rank {rank}: {name} failed: {check}")
    rows = (ranks.get(0) or {}).get("throughput", [])
    for row in rows:
        for part in ("engine", "reference_sequential", "reference_concurrent"):
            if part not in row:
                problems.append(f"no {part} time at {format_size(row['bytes'])}")
            elif not row[part]["correct"] or row[part]["median_s"] <= 0:
                problems.append(f"{part} at {format_size(row['bytes'])} moved wrong data")
    if len(rows) != len(sizes):
        problems.append(f"throughput measured at {len(rows)} of {len(sizes)} sizes")
    correct = not failed_cases and all(
        result is not None and len(result.get("correctness", {}).get("cases", [])) == planned
        for result in ranks.values()
    )
    return {
        "correctness": {
            "all_passed": correct,
            "planned_per_rank": planned,
            "sizes": args.check_size_list,
            "failed_count": len(failed_cases),
            "failed": failed_cases[:200],
        },
        "order_checks": {
            "ranks": sum(1 for checks in order.values() if checks),
            "all_passed": all(check.get("ok") for checks in order.values() for check in checks.values()),
        },
        "throughput": rows,
        "engine_stats": {rank: (result or {}).get("engine_stats") for rank, result in ranks.items()},
        "engine_rails": (ranks.get(0) or {}).get("engine_rails"),
        "reference_endpoint": (ranks.get(0) or {}).get("reference_endpoint"),
        "gpu": (ranks.get(0) or {}).get("gpu"),
        "problems": problems,
    }


def summarize_compare(ranks: dict[int, dict[str, Any] | None], args: argparse.Namespace, spec: str) -> dict[str, Any]:
    """Rank 0's rows (each the slower rank's median): time, busbw, and the engine against the others."""
    problems: list[str] = []
    machines, local = parse_layout(spec)
    world = machines * local
    for rank, result in ranks.items():
        problems += rank_problems(rank, result)
    compare = (ranks.get(0) or {}).get("compare", {})
    contenders, rows = compare.get("contenders", []), compare.get("rows", [])
    for row in rows:
        for name in contenders:
            if not row[name]["correct"]:
                problems.append(f"{name} at {format_size(row['bytes'])} gave wrong results")
            row[name]["busbw_GBps"] = row["bytes"] / row[name]["median_s"] / 1e9 * 2 * (world - 1) / world
        for name in contenders[1:]:
            row[f"fairring_vs_{name}"] = row[name]["median_s"] / row["fairring"]["median_s"]
    if len(rows) != len(args.compare_size_list):
        problems.append(f"compared at {len(rows)} of {len(args.compare_size_list)} sizes")
    return {"layout": spec, "contenders": contenders, "rows": rows, "problems": problems}


def training_lines(summary: dict[str, Any]) -> list[str]:
    rows = summary.get("rows", [])
    if not rows:
        return ["Not run."]
    body = [
        [
            row["model"],
            row["backend"],
            f"{row['median_s']:.3f}" if row.get("median_s") else "-",
            f"{row['speedup_vs_baseline']:.2f}x" if row.get("speedup_vs_baseline") else "",
            f"{row['loss_gap']:.1e}" if row.get("loss_gap") is not None else "",
        ]
        for row in rows
    ]
    return table(["model", "backend", "step s", "vs baseline", "loss gap"], body)


def failure_lines(summary: dict[str, Any]) -> list[str]:
    outcomes = summary.get("outcomes", {})
    if not outcomes:
        return ["Not run."]
    lines = [f"Rank {summary['victim']} killed itself (SIGKILL) mid-stream; what each survivor saw:", ""]
    rows = [
        [
            rank,
            f"{outcome.get('seconds', float('nan')):.2f}",
            f"{outcome.get('destroy_seconds', float('nan')):.2f}",
            str(outcome.get("first", ""))[:200].replace("|", "/").replace("\n", " "),
        ]
        for rank, outcome in sorted(outcomes.items())
    ]
    return lines + table(["rank", "error after s", "teardown s", "first error"], rows)


def compare_lines(summary: dict[str, Any]) -> list[str]:
    contenders, rows = summary.get("contenders", []), summary.get("rows", [])
    if not rows:
        return ["Not run."]
    nccl = [f"- `{line}`" for line in summary.get("nccl_info", [])]
    lines = [
        *(["NCCL, rank 0 (NCCL_DEBUG=INFO):", "", *nccl, ""] if nccl else []),
        f"float32 all_reduce on {summary['layout']} (machines x ranks), the same tensors in the same processes,",
        "the order alternated each round; median of the slower rank's times. fairring is its engine at every",
        "size (FAIRRING_FLAT_THRESHOLD=0). One GPU time-sliced between the processes, NCCL over its socket",
        "transport on loopback: this compares code paths on one machine, not a cluster.",
        "",
    ]
    header = ["size", *(f"{name} ms" for name in contenders), *(f"{name} busbw GB/s" for name in contenders)]
    header += [f"fairring vs {name}" for name in contenders[1:]]
    body = []
    for row in rows:
        body.append([
            format_size(row["bytes"]),
            *(f"{row[name]['median_s'] * 1e3:.3f}" for name in contenders),
            *(f"{row[name]['busbw_GBps']:.3f}" for name in contenders),
            *(f"{row[f'fairring_vs_{name}']:.2f}x" for name in contenders[1:]),
        ])  # fmt: skip
    return lines + table(header, body)


def summarize_stress(ranks: dict[int, dict[str, Any] | None], args: argparse.Namespace) -> dict[str, Any]:
    """Every rank's checks; per round, the slower rank's time."""
    problems: list[str] = []
    planned = args.stress_ops * args.stress_rounds
    failed: list[dict[str, Any]] = []
    seconds: dict[int, float] = {}
    for rank, result in ranks.items():
        problems += rank_problems(rank, result)
        stress = (result or {}).get("stress", {})
        cases = stress.get("cases", [])
        failed += [{"rank": rank, **case} for case in cases if not case.get("ok")]
        if result is not None and len(cases) != planned:
            problems.append(f"rank {rank} checked {len(cases)} of {planned} all-reduces")
        for row in stress.get("rounds", []):
            seconds[row["round"]] = max(seconds.get(row["round"], 0.0), row["seconds"])
    if failed:
        problems.append(f"{len(failed)} all-reduce(s) gave wrong results")
    rails = (ranks.get(0) or {}).get("engine_rails")
    if args.device == "cuda" and rails is not None and "cuda_basic" not in rails:
        problems.append(f"the engine's rails do not name cuda_basic: {rails}")
    return {
        "ops": args.stress_ops,
        "bytes": args.stress_bytes,
        "rounds": args.stress_rounds,
        "round_seconds": [seconds[index] for index in sorted(seconds)],
        "failed": failed[:50],
        "engine_stats": {rank: (result or {}).get("engine_stats") for rank, result in ranks.items()},
        "engine_rails": rails,
        "problems": problems,
    }


def build_stage(args: argparse.Namespace) -> Stage:
    stage = Stage("build", commands=[args.build_command] if args.build_command else [])
    if args.build_log is None:
        stage.detail = "not run by this command (make gpu-check builds first)"
        return stage
    stage.status, stage.seconds = "ok", args.build_seconds or 0.0
    stage.output_tail = tail(args.build_log.read_text(errors="replace")) if args.build_log.exists() else ""
    built = fairring.build_info()
    if args.device == "cuda" and not built.get("cuda_path"):
        stage.status, stage.detail = "failed", "built without the CUDA path"
    else:
        stage.detail = f"built against torch {built.get('torch')}, CUDA path: {built.get('cuda_path')}"
    return stage


def cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]


def milliseconds(part: dict[str, Any] | None) -> str:
    return f"{part['median_s'] * 1e3:.3f}" if part else "-"


def percent(value: float | None) -> str:
    return f"{value * 100:.0f}%" if value is not None else "-"


def throughput_lines(rows: list[dict[str, Any]]) -> list[str]:
    header = ["size", "engine ms", "algbw GB/s", "busbw GB/s", "rails seq. ms", "rails conc. ms"]
    header += ["engine vs seq.", "engine vs conc.", "data ok"]
    body = []
    for row in rows:
        parts = [row.get(name) for name in ("engine", "reference_sequential", "reference_concurrent")]
        body.append([
            format_size(row["bytes"]), milliseconds(parts[0]),
            f"{row['algbw_GBps']:.3f}" if "algbw_GBps" in row else "-",
            f"{row['busbw_GBps']:.3f}" if "busbw_GBps" in row else "-",
            milliseconds(parts[1]), milliseconds(parts[2]),
            percent(row.get("fraction_of_sequential")), percent(row.get("fraction_of_concurrent")),
            "yes" if all(part and part["correct"] for part in parts) else "NO",
        ])  # fmt: skip
    return [
        "float32 all_reduce, median of the slower rank's times, each from a barrier to the last wait and a device",
        "synchronize. busbw = algbw x 2(n-1)/n (n = 2). The rails reference moves the bytes the engine must move,",
        "with fairring._C._testing.RailsEndpoint between the same processes: S/2 each way on lane 0, then S/2 on",
        """lane 1 ("seq."), or both halves at once ("conc."). "engine vs" = reference time / engine time.""",
        "",
        *table(header, body),
    ]


def correctness_lines(correctness: dict[str, Any], device: str) -> list[str]:
    if not correctness:
        return ["Not run."]
    cases = check_cases(device)
    dtypes = list(dict.fromkeys(dtype_name(dtype) for dtype, _ in cases))
    ops = list(dict.fromkeys(op for _, op in cases))
    what = (
        f"{len(cases)} (dtype, op) cases x sizes {correctness['sizes']} elements = {correctness['planned_per_rank']}"
        f" per rank; dtypes {', '.join(dtypes)}; ops {', '.join(ops)}; every case of one size in flight at once;"
        " results compared exactly with torch on the CPU (inputs are chosen so that every result is exact)."
    )
    if correctness["all_passed"]:
        return [f"All cases passed on every rank: {what}"]
    failed = correctness["failed"]
    count = correctness["failed_count"]
    rows = [[case["rank"], case["dtype"], case["op"], case["numel"], describe_failure(case)] for case in failed[:60]]
    status = f"{count} case(s) failed" if count else "not every case was checked on every rank"
    lines = [f"FAILED: {status}. {what}", ""]
    lines += table(["rank", "dtype", "op", "elements", "what"], rows)
    return lines + ([f"... and {count - len(rows)} more (the JSON below lists 200)"] if count > len(rows) else [])


def describe_failure(case: dict[str, Any]) -> str:
    if "error" in case:
        return str(case["error"])[:300]
    where, error = case.get("first_bad_index"), case.get("max_abs_error")
    return f"{case.get('mismatches')} wrong elements, first at {where}, max error {error}"


def stress_lines(stress: dict[str, Any]) -> list[str]:
    if not stress:
        return ["Not run."]
    plan, size, round_bytes = stress["plan"], format_size(stress["bytes"]), stress["ops"] * stress["bytes"]
    what = (
        f"{stress['ops']} float32 sums of {size} in flight at once, {stress['rounds']} rounds, {BENCH_WORLD}"
        f" processes as {BENCH_WORLD} machines; {json.dumps(stress['settings'])}. Each all-reduce:"
        f" {plan['slices']} slice(s) of {format_size(plan['slice_numel'] * 4)}, shards of"
        f" {format_size(plan['shard_bytes'])}, {plan['slices_in_flight']} in flight. Every result compared"
        " exactly (integers in [-128, 133]); a round's time runs from issuing its all-reduces to the last"
        " one's end on the device."
    )
    lines = [what, "", f"engine rails: `{stress.get('engine_rails')}`", ""]
    rows = [
        [index, f"{seconds:.3f}", f"{round_bytes / seconds / 1e9:.3f}"]
        for index, seconds in enumerate(stress["round_seconds"])
    ]
    lines += table(["round", "seconds (slower rank)", "algbw GB/s"], rows) if rows else ["No round finished."]
    failed = stress["failed"]
    if failed:
        body = [[case["rank"], case["round"], case["seed"], describe_failure(case)] for case in failed]
        lines += ["", *table(["rank", "round", "seed", "what"], body)]
    return lines


def render(report: dict[str, Any], stages: list[Stage]) -> str:
    env, bench = report["environment"], report["bench"]
    if not report["complete"]:
        verdict = "INCOMPLETE (the check is running or was cut short; stages not run yet say so)"
        if not report["passed"]:
            verdict += ", FAILED so far (" + ", ".join(report["failed_stages"]) + ")"
    elif not report["passed"]:
        verdict = "FAILED (" + ", ".join(report["failed_stages"]) + ")"
    elif report["skipped_for_budget"]:
        verdict = "PASSED, but the budget left out: " + ", ".join(report["skipped_for_budget"])
    else:
        verdict = "PASSED"
    lines = [f"# fairring GPU check: {verdict}", ""]
    lines += [f"{env['date']} on {env['host']}, {report['seconds']:.0f} s, --device {report['device']}.", ""]
    gpus = env.get("gpus") or []
    lines += ["## Environment", ""]
    lines += table(["item", "value"], [
        ["python", f"{env['python']} ({env['python_executable']})"],
        ["torch", env["torch"]],
        ["torch.version.cuda", env["torch_cuda"]],
        ["CUDA_HOME", env["cuda_home"]],
        ["compiler", env["compiler"]],
        ["nvcc", env["nvcc"]],
        ["torch.cuda.nccl.version()", env["nccl"]],
        ["fairring", env["fairring"]],
        ["fairring.build_info()", json.dumps(env["fairring_build"])],
        ["GPUs", f"{env['gpu_count']}: {', '.join(gpus)}" if gpus else env["gpu_count"]],
        ["bench GPU", json.dumps(bench.get("gpu")) if bench.get("gpu") else "-"],
        ["nvidia-smi", env.get("nvidia_smi", "not found")],
        ["iproute2 (ip, tc)", env.get("iproute2", "-")],
        ["CPUs", f"{env['cpus']} (nproc {env['nproc']})"],
        ["environment", json.dumps(env["environment"])],
    ])  # fmt: skip
    lines += ["", "## Versus NCCL, the network the bottleneck", ""]
    lines += versus_nccl.lines(report["versus"], table, percent)
    lines += ["", "## Stages", ""]
    lines += table(
        ["stage", "status", "seconds", "detail"],
        [[stage.name, stage.status, f"{stage.seconds:.1f}", stage.detail] for stage in stages],
    )
    lines += ["", "## Commands", "", "```sh", report["command"]]
    lines += [command for stage in stages for command in stage.commands]
    lines += ["```", "", "## Throughput", ""]
    lines += throughput_lines(bench.get("throughput", [])) if bench else ["Not run."]
    lines += ["", "## Correctness", "", f"{BENCH_WORLD} processes as {BENCH_WORLD} machines (the bench):", ""]
    lines += correctness_lines(bench.get("correctness", {}), report["device"])
    for spec, summary in report["worlds"].items():
        lines += ["", world_stage(spec).removeprefix("correctness: ") + ":", ""]
        lines += correctness_lines(summary.get("correctness", {}), report["device"])
    lines += ["", "## Side by side"]
    for summary in report["compare"].values():
        lines += ["", *compare_lines(summary)]
    lines += ["", "## A rank killed", "", *failure_lines(report["failure"])]
    lines += ["", "## Training", "", *training_lines(report["training"])]
    lines += ["", "## Stress", "", *stress_lines(report["stress"])]
    lines += ["", "## Validate", "", *validate_lines(report["validate"])]
    nixl = report["nixl"]
    lines += [
        "",
        "## NIXL rails",
        "",
        "The engine with FAIRRING_RAILS_TRANSPORT=nixl; the rails reference is TensorPipe's.",
        "",
    ]
    lines += throughput_lines(nixl.get("throughput", [])) if nixl else ["Not run."]
    if nixl:
        lines += ["", *correctness_lines(nixl.get("correctness", {}), report["device"])]
    lines += ["", "## Engine", "", f"engine_stats per rank: `{json.dumps(bench.get('engine_stats'))}`", ""]
    lines += [
        f"engine rails: `{bench.get('engine_rails')}`",
        "",
        f"reference endpoint: `{bench.get('reference_endpoint')}`",
    ]
    by_stage = {BENCH_STAGE: bench, STRESS_STAGE: report["stress"], NIXL_STAGE: nixl}
    by_stage.update({compare_stage(spec): summary for spec, summary in report["compare"].items()})
    by_stage["failure"] = report["failure"]
    by_stage["training"] = report["training"]
    by_stage["versus"] = report["versus"]
    by_stage["validate"] = report["validate"]
    by_stage.update({world_stage(world): summary for world, summary in report["worlds"].items()})
    problems = [f"{name}: {problem}" for name, summary in by_stage.items() for problem in summary.get("problems", [])]
    if problems:
        lines += ["", "## Problems", "", *[f"- {problem}" for problem in problems]]
    lines += ["", "## Output"]
    for stage in stages:
        if stage.output_tail:
            lines += ["", f"### {stage.name}", "", "```text", stage.output_tail.rstrip(), "```"]
    lines += ["", "## Data", "", "```json", json.dumps(report, indent=1, default=str), "```", ""]
    return "\n".join(lines)


def steps(args: argparse.Namespace) -> list[Step]:
    """The stages in order."""
    tests_skip = ""
    if args.tests == "skip":
        tests_skip = "skipped (--tests skip)"
    elif args.tests == "auto" and args.device == "cpu":
        tests_skip = "skipped (--device cpu)"

    def world_step(spec: str) -> Step:
        machines, local = parse_layout(spec)
        limit = args.worlds_timeout or WORLD_LIMIT_PER_PROCESS_S * machines * local
        reserve = WORLD_MINIMUM_PER_PROCESS_S[args.device] * machines * local
        return Step(world_stage(spec), limit, reserve, functools.partial(run_world, args, spec))

    def compare_step(spec: str) -> Step:
        run = functools.partial(run_compare, args, spec)
        return Step(compare_stage(spec), args.compare_timeout, COMPARE_MINIMUM_S, run)

    # In order of value: the figure against NCCL where the network is the bottleneck, which no CPU
    # machine can give, then the CUDA tests, then the local steps on real NCCL.
    with_local_steps = [spec for spec in args.world_list if parse_layout(spec)[1] > 1]
    return [
        Step(
            versus_nccl.STAGE,
            args.versus_timeout,
            versus_nccl.MINIMUM_S,
            functools.partial(run_versus, args),
            why_no_netns(),
        ),
        Step(
            TESTS_STAGE,
            args.tests_timeout,
            TESTS_MINIMUM_S,
            lambda seconds: (run_tests(args, seconds), {}),
            tests_skip,
        ),
        *(world_step(spec) for spec in with_local_steps),
        *(compare_step(spec) for spec in args.compare_list),
        Step(FAILURE_STAGE, args.failure_timeout, FAILURE_MINIMUM_S, functools.partial(run_failure, args)),
        Step(BENCH_STAGE, args.bench_timeout, BENCH_MINIMUM_S, functools.partial(run_bench, args)),
        Step(TRAINING_STAGE, args.training_timeout, TRAINING_MINIMUM_S, functools.partial(run_training, args)),
        *(world_step(spec) for spec in args.world_list if spec not in with_local_steps),
        Step(
            STRESS_STAGE,
            args.stress_timeout,
            STRESS_MINIMUM_S,
            functools.partial(run_stress, args),
            "" if args.stress_rounds else "skipped (--stress-rounds 0)",
        ),
        Step(VALIDATE_STAGE, args.validate_timeout, VALIDATE_MINIMUM_S, functools.partial(run_validate, args)),
        Step(NIXL_STAGE, args.nixl_timeout, NIXL_MINIMUM_S, functools.partial(run_nixl, args), why_no_nixl()),
    ]


def run_steps(
    todo: list[Step], deadline: float, written: Callable[[list[Stage], dict[str, dict[str, Any]], list[str]], None]
) -> tuple[list[Stage], dict[str, dict[str, Any]], list[str]]:
    """Each stage, what it found by stage name, and the stages the budget left out; `written` is
    called after each stage, so that a check cut short has reported what it ran."""
    stages: list[Stage] = []
    summaries: dict[str, dict[str, Any]] = {}
    left_out: list[str] = []
    for index, step in enumerate(todo):
        if step.skip:
            stages.append(Stage(step.name, detail=step.skip))
            continue
        left = deadline - time.monotonic() - REPORT_RESERVE_S
        kept = sum(later.reserve for later in todo[index + 1 :] if not later.skip)
        seconds = min(step.limit, left, max(left - kept, step.reserve, STAGE_MINIMUM_S))
        if seconds < STAGE_MINIMUM_S:
            stages.append(Stage(step.name, detail=f"skipped: {max(left, 0):.0f} s of the budget left"))
            left_out.append(step.name)
            continue
        try:
            stage, summaries[step.name] = step.run(seconds)
        except Exception:
            stage = Stage(step.name, "failed", detail="the check itself failed", output_tail=tail(format_exc()))
        stages.append(stage)
        not_yet = [Stage(later.name, detail="not run yet") for later in todo[index + 1 :]]
        written(stages + not_yet, summaries, left_out)
    return stages, summaries, left_out


def write_report(
    args: argparse.Namespace,
    argv: list[str],
    info: dict[str, Any],
    started: float,
    stages: list[Stage],
    summaries: dict[str, dict[str, Any]],
    left_out: list[str],
    complete: bool = True,
) -> bool:
    """Writes the report as it stands (`complete`: every stage has had its turn); whether none failed."""
    failed = [stage.name for stage in stages if stage.status == "failed"]
    report = {
        "complete": complete,
        "passed": not failed,
        "failed_stages": failed,
        "skipped_for_budget": left_out,
        "device": args.device,
        "seconds": time.monotonic() - started,
        "command": display([sys.executable, "-m", "benchmarks.gpu_check", *argv]),
        "environment": info,
        "stages": [{k: v for k, v in asdict(stage).items() if k != "output_tail"} for stage in stages],
        "bench": summaries.get(BENCH_STAGE, {}),
        "worlds": {spec: summaries.get(world_stage(spec), {}) for spec in args.world_list},
        "compare": {spec: summaries.get(compare_stage(spec), {}) for spec in args.compare_list},
        "failure": summaries.get(FAILURE_STAGE, {}),
        "training": summaries.get(TRAINING_STAGE, {}),
        "versus": summaries.get(versus_nccl.STAGE, {}),
        "stress": summaries.get(STRESS_STAGE, {}),
        "validate": summaries.get(VALIDATE_STAGE, {}),
        "nixl": summaries.get(NIXL_STAGE, {}),
    }
    args.report.parent.mkdir(parents=True, exist_ok=True)
    partial = args.report.with_suffix(".partial")
    partial.write_text(render(report, stages))
    partial.replace(args.report)
    return not failed


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    deadline = time.monotonic() + args.budget
    started = time.monotonic()
    tools = gpu_tools.provide()  # before anything asks whether network namespaces can be made
    info = environment()
    info["iproute2"] = tools
    built = [build_stage(args)]

    def written(stages: list[Stage], summaries: dict[str, dict[str, Any]], left_out: list[str]) -> None:
        write_report(args, argv, info, started, built + stages, summaries, left_out, complete=False)

    if args.device == "cuda" and not torch.cuda.is_available():
        missing = Stage("environment", "failed", detail="no CUDA device is visible to torch (use --device cpu)")
        ran, summaries, left_out = (
            [missing, *(Stage(step.name, detail="skipped: no GPU") for step in steps(args))],
            {},
            [],
        )
    else:
        ran, summaries, left_out = run_steps(steps(args), deadline, written)
        if args.device == "cuda":  # after the stages: this process held no CUDA context while they ran
            info["gpus"] = gpu_names()
    stages = built + ran
    passed = write_report(args, argv, info, started, stages, summaries, left_out)
    failed = [stage.name for stage in stages if stage.status == "failed"]
    print(args.report.read_text().split("\n## Output", 1)[0])
    print(f"gpu-check: {'PASSED' if passed else 'FAILED: ' + ', '.join(failed)}; report: {args.report}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
