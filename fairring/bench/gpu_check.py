"""fairring's GPU check: the CUDA tests and a CUDA bench, written to one report (`make gpu-check`).

Needs no network and no virtual environment: run it with the python whose
torch fairring was just built against (`make gpu-check` builds first). Stages,
each with its own time limit inside --budget, so the whole check ends in time:

1. environment: torch, CUDA, NCCL, fairring.build_info(), the GPUs;
2. tests: `python -m pytest tests/test_cuda.py -rs -s -p no:cacheprovider`;
3. bench: two processes on one GPU as two machines (fairring.bench.cuda_bench):
   engine all-reduce throughput against fairring._C.RailsEndpoint moving the same
   bytes between the same two processes, then every dtype and op checked against
   plain torch on the CPU.

A stage that fails is recorded and the next one runs; the exit status is 1 if
any stage failed (or no GPU is visible), else 0. --device cpu runs the same bench
on CPU tensors (a smoke test for machines without a GPU) and skips the tests.

    python -m fairring.bench.gpu_check --report gpu-check-report.md
    python -m fairring.bench.gpu_check --device cpu --quick --report /tmp/report.md
"""

from __future__ import annotations

import argparse
import datetime
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from traceback import format_exc
from typing import Any

import torch

import fairring
from fairring.config import ConfigError, format_size, parse_size

from . import free_port
from .cuda_bench import WORLD, check_cases, dtype_name

ROOT = Path(__file__).resolve().parents[2]
TEST_COMMAND = ["-m", "pytest", "tests/test_cuda.py", "-rs", "-s", "-p", "no:cacheprovider"]
DEFAULT_SIZES = {"cuda": "1MiB,4MiB,16MiB,64MiB,256MiB", "cpu": "1MiB,4MiB,16MiB"}
QUICK_SIZES = {"cuda": "1MiB,16MiB,64MiB", "cpu": "64KiB,1MiB"}
DEFAULT_CHECK_SIZES = "1,1000,65537,1000003"
QUICK_CHECK_SIZES = "1,1000,65537"
# The bench needs about this long at least; the tests may use what is left before it.
BENCH_MINIMUM_S = 120.0
# Once one rank has failed, how long the other gets to finish writing its results.
FAILURE_GRACE_S = 15.0
# Once every rank has written all of its results, how long they get to tear down and exit.
TEARDOWN_GRACE_S = 30.0
TAIL_CHARS = 12_000
TESTS_STAGE = "tests: tests/test_cuda.py"
BENCH_STAGE = f"bench: {WORLD} processes as {WORLD} machines"


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


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fairring.bench.gpu_check",
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
    parser.add_argument("--op-timeout", type=float, default=60.0, help="seconds any one wait in the bench may take")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for every stage together (default 540)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="VAR=VALUE", help="environment for the bench's ranks"
    )
    parser.add_argument("--build-log", type=Path, help="the build's output, for the report (make gpu-check)")
    parser.add_argument("--build-seconds", type=float, help="how long the build took (make gpu-check)")
    parser.add_argument("--build-command", default="", help="the build's command line (make gpu-check)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.iters = args.iters if args.iters is not None else 3 if quick else 10
    args.warmup = args.warmup if args.warmup is not None else 1 if quick else 3
    sizes = args.sizes or (QUICK_SIZES if quick else DEFAULT_SIZES)[args.device]
    check_sizes = args.check_sizes or (QUICK_CHECK_SIZES if quick else DEFAULT_CHECK_SIZES)
    try:
        args.size_list = [parse_size("--sizes", text.strip()) for text in sizes.split(",")]
        args.check_size_list = [int(text.strip()) for text in check_sizes.split(",")]
    except (ConfigError, ValueError) as error:
        parser.error(str(error))
    if any(size % 8 for size in args.size_list) or min(args.check_size_list) < 1:
        parser.error("--sizes must be multiples of 8 bytes and --check-sizes at least 1 element")
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


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
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
    if args.tests == "skip" or (args.tests == "auto" and args.device == "cpu"):
        stage.detail = "skipped (--device cpu)" if args.tests == "auto" else "skipped (--tests skip)"
        return stage
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


def rank_command(args: argparse.Namespace, rank: int, port: int, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "fairring.bench.cuda_bench", "--rank", str(rank), "--port", str(port),
        "--device", args.device, "--sizes", ",".join(str(s) for s in args.size_list),
        "--check-sizes", ",".join(str(n) for n in args.check_size_list), "--iters", str(args.iters),
        "--warmup", str(args.warmup), "--op-timeout", str(args.op_timeout), "--out", str(out),
    ]  # fmt: skip


def rank_environment(args: argparse.Namespace, rank: int, port: int) -> dict[str, str]:
    return {
        **os.environ,
        # Each process is its own machine; both share this host, so every path stays on loopback.
        "FAIRRING_MACHINE_ID": f"machine-{rank}",
        "TP_SOCKET_IFNAME": "lo",
        "GLOO_SOCKET_IFNAME": "lo",
        "FAIRRING_CUDA_ENGINE": "1",
        # The engine at every size, to check it there: by default small CUDA all-reduces go to NCCL.
        "FAIRRING_FLAT_THRESHOLD": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(WORLD),
        **dict(assignment.split("=", 1) for assignment in args.set),
    }


def wait_ranks(ranks: list[subprocess.Popen[bytes]], timeout: float, out: Path) -> tuple[list[int | None], str]:
    """Exit codes (None: killed); why they were killed, if they were."""
    deadline = time.monotonic() + timeout
    first_failure: float | None = None
    finished: float | None = None
    while any(rank.poll() is None for rank in ranks):
        now = time.monotonic()
        if first_failure is None and any(rank.returncode not in (None, 0) for rank in ranks):
            first_failure = now
        if finished is None and all((out / f"rank{r}.finished").exists() for r in range(len(ranks))):
            finished = now
        if now > deadline:
            why = f"killed after {timeout:.0f} s"
            break
        if first_failure is not None and now - first_failure > FAILURE_GRACE_S:
            why = f"killed {FAILURE_GRACE_S:.0f} s after the other rank failed"
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


def run_bench(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    port = free_port()
    stage = Stage(BENCH_STAGE)
    data: dict[str, Any] = {"ranks": {}}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        commands = [rank_command(args, rank, port, out) for rank in range(WORLD)]
        stage.commands = [
            f"FAIRRING_MACHINE_ID=machine-{r} TP_SOCKET_IFNAME=lo FAIRRING_CUDA_ENGINE=1 {display(c)}"
            for r, c in enumerate(commands)
        ]
        print(f"gpu-check: bench, {WORLD} ranks (at most {timeout:.0f} s)", flush=True)
        start = time.monotonic()
        ranks = []
        try:
            for rank, command in enumerate(commands):
                ranks.append(run_command(command, rank_environment(args, rank, port), out / f"rank{rank}.log"))
            codes, why = wait_ranks(ranks, timeout, out)
        finally:
            for process in ranks:
                kill(process)
        stage.seconds = time.monotonic() - start
        logs = []
        for rank in range(WORLD):
            data["ranks"][rank] = read_results(out / f"rank{rank}.json")
            log = tail((out / f"rank{rank}.log").read_text(errors="replace"), 6000)
            ended = "killed" if codes[rank] is None else f"exit code {codes[rank]}"
            logs.append(f"--- rank {rank} ({ended}) ---\n{log}")
        stage.output_tail = "\n".join(logs)
    data["summary"] = summarize(data["ranks"], args)
    problems = data["summary"]["problems"]
    if why:
        problems.insert(0, why)
    problems += [f"rank {r} exited with code {code}" for r, code in enumerate(codes) if code not in (0, None)]
    stage.status = "failed" if problems else "ok"
    stage.detail = "; ".join(problems[:6]) or "all results correct"
    return stage, data


def read_results(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summarize(ranks: dict[int, dict[str, Any] | None], args: argparse.Namespace) -> dict[str, Any]:
    """What the report shows: rank 0's timings (the slower rank's), every rank's checks."""
    problems: list[str] = []
    planned = len(check_cases(args.device)) * len(args.check_size_list)
    failed_cases: list[dict[str, Any]] = []
    for rank, result in ranks.items():
        if result is None:
            problems.append(f"rank {rank} wrote no results")
            continue
        problems += [f"rank {rank}: {error['where']} failed" for error in result.get("errors", [])]
        cases = result.get("correctness", {}).get("cases", [])
        failed_cases += [{"rank": rank, **case} for case in cases if not case.get("ok")]
        if len(cases) != planned:
            problems.append(f"rank {rank} checked {len(cases)} of {planned} correctness cases")
        if not result.get("done"):
            problems.append(f"rank {rank} did not finish")
    if failed_cases:
        problems.append(f"{len(failed_cases)} correctness case(s) failed")
    rows = (ranks.get(0) or {}).get("throughput", [])
    for row in rows:
        for part in ("engine", "reference_sequential", "reference_concurrent"):
            if part not in row:
                problems.append(f"no {part} time at {format_size(row['bytes'])}")
            elif not row[part]["correct"] or row[part]["median_s"] <= 0:
                problems.append(f"{part} at {format_size(row['bytes'])} moved wrong data")
    if len(rows) != len(args.size_list):
        problems.append(f"throughput measured at {len(rows)} of {len(args.size_list)} sizes")
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
        "throughput": rows,
        "engine_stats": {rank: (result or {}).get("engine_stats") for rank, result in ranks.items()},
        "engine_rails": (ranks.get(0) or {}).get("engine_rails"),
        "reference_endpoint": (ranks.get(0) or {}).get("reference_endpoint"),
        "gpu": (ranks.get(0) or {}).get("gpu"),
        "problems": problems,
    }


def budget_for(stage_limit: float, deadline: float, reserve: float) -> float:
    return max(10.0, min(stage_limit, deadline - time.monotonic() - reserve))


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
        "with fairring._C.RailsEndpoint between the same processes: S/2 each way on lane 0, then S/2 on lane 1",
        '("seq."), or both halves at once ("conc."). "engine vs" = reference time / engine time.',
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


def render(report: dict[str, Any], stages: list[Stage]) -> str:
    env, bench = report["environment"], report["bench"]
    verdict = "PASSED" if report["passed"] else "FAILED (" + ", ".join(report["failed_stages"]) + ")"
    lines = [f"# fairring GPU check: {verdict}", ""]
    lines += [f"{env['date']} on {env['host']}, {report['seconds']:.0f} s, --device {report['device']}.", ""]
    gpus = env.get("gpus") or []
    lines += ["## Environment", ""]
    lines += table(["item", "value"], [
        ["python", f"{env['python']} ({env['python_executable']})"],
        ["torch", env["torch"]],
        ["torch.version.cuda", env["torch_cuda"]],
        ["torch.cuda.nccl.version()", env["nccl"]],
        ["fairring", env["fairring"]],
        ["fairring.build_info()", json.dumps(env["fairring_build"])],
        ["GPUs", f"{env['gpu_count']}: {', '.join(gpus)}" if gpus else env["gpu_count"]],
        ["bench GPU", json.dumps(bench.get("gpu")) if bench.get("gpu") else "-"],
        ["nvidia-smi", env.get("nvidia_smi", "not found")],
        ["CPUs", env["cpus"]],
        ["environment", json.dumps(env["environment"])],
    ])  # fmt: skip
    lines += ["", "## Stages", ""]
    lines += table(
        ["stage", "status", "seconds", "detail"],
        [[stage.name, stage.status, f"{stage.seconds:.1f}", stage.detail] for stage in stages],
    )
    lines += ["", "## Commands", "", "```sh", report["command"]]
    lines += [command for stage in stages for command in stage.commands]
    lines += ["```", "", "## Throughput", ""]
    lines += throughput_lines(bench.get("throughput", [])) if bench else ["Not run."]
    lines += ["", "## Correctness", "", *correctness_lines(bench.get("correctness", {}), report["device"])]
    lines += ["", "## Engine", "", f"engine_stats per rank: `{json.dumps(bench.get('engine_stats'))}`", ""]
    lines += [
        f"engine rails: `{bench.get('engine_rails')}`",
        "",
        f"reference endpoint: `{bench.get('reference_endpoint')}`",
    ]
    problems = bench.get("problems") or []
    if problems:
        lines += ["", "## Problems", "", *[f"- {problem}" for problem in problems]]
    lines += ["", "## Output"]
    for stage in stages:
        if stage.output_tail:
            lines += ["", f"### {stage.name}", "", "```text", stage.output_tail.rstrip(), "```"]
    lines += ["", "## Data", "", "```json", json.dumps(report, indent=1, default=str), "```", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    deadline = time.monotonic() + args.budget
    started = time.monotonic()
    info = environment()
    stages = [build_stage(args)]
    bench: dict[str, Any] = {}
    no_gpu = args.device == "cuda" and not torch.cuda.is_available()
    if no_gpu:
        stages.append(Stage("environment", "failed", detail="no CUDA device is visible to torch (use --device cpu)"))
        stages += [Stage(TESTS_STAGE, detail="skipped: no GPU"), Stage(BENCH_STAGE, detail="skipped: no GPU")]
    else:
        try:
            stages.append(run_tests(args, budget_for(args.tests_timeout, deadline, BENCH_MINIMUM_S)))
        except Exception:
            stages.append(
                Stage(TESTS_STAGE, "failed", detail="the check itself failed", output_tail=tail(format_exc()))
            )
        try:
            bench_stage, bench = run_bench(args, budget_for(args.bench_timeout, deadline, 5.0))
            stages.append(bench_stage)
        except Exception:
            stages.append(
                Stage(BENCH_STAGE, "failed", detail="the check itself failed", output_tail=tail(format_exc()))
            )
    if args.device == "cuda" and not no_gpu:
        info["gpus"] = gpu_names()
    failed = [stage.name for stage in stages if stage.status == "failed"]
    report = {
        "passed": not failed,
        "failed_stages": failed,
        "device": args.device,
        "seconds": time.monotonic() - started,
        "command": display([sys.executable, "-m", "fairring.bench.gpu_check", *argv]),
        "environment": info,
        "stages": [{k: v for k, v in asdict(stage).items() if k != "output_tail"} for stage in stages],
        "bench": bench.get("summary", {}),
    }
    text = render(report, stages)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(text)
    print(text.split("\n## Output", 1)[0])
    print(f"gpu-check: {'PASSED' if not failed else 'FAILED: ' + ', '.join(failed)}; report: {args.report}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
