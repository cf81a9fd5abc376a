"""The stages' ranks: `python -m benchmarks.cuda_bench` processes on this host as machines, and what they found."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cuda_bench import check_cases
from fairring._config import CUDA_ENGINE, FLAT_THRESHOLD
from fairring._sizes import format_size
from fairring.bench import free_port
from fairring.bench.shared_gpu import shared_gpu_env

from .processes import kill, read_results, run_command
from .stage import Stage, display, tail

# The bench, stress and NIXL stages: two processes as two machines.
BENCH_WORLD = 2
# Once one rank has failed, how long the others get to finish writing their results.
FAILURE_GRACE_S = 15.0
# Once every rank has written all of its results, how long they get to tear down and exit.
TEARDOWN_GRACE_S = 30.0
# NCCL's INFO lines (NCCL_DEBUG=INFO) that say which transport and interface it uses.
NCCL_TRANSPORT_LINE = re.compile(r"NCCL INFO ((?:Using network|NET/\w+ : Using|NCCL version) [^\n]*)")
# The rank settings a report's commands show.
SHOWN_SETTINGS = ("FAIRRING_", "TP_", "NCCL_", "CUDA_")


def rank_command(args: argparse.Namespace, world: int, rank: int, port: int, out: Path, phases: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "benchmarks.cuda_bench", "--rank", str(rank), "--world", str(world),
        "--port", str(port), "--device", args.device, "--op-timeout", str(args.op_timeout), *phases,
        "--out", str(out),
    ]  # fmt: skip


def rank_settings(
    args: argparse.Namespace, world: int, rank: int, port: int, extra: dict[str, str], local: int = 1
) -> dict[str, str]:
    """The rank's environment on top of this process's; `extra` (a stage's own) wins over --set."""
    return {
        # Machines of `local` processes; all share this host, so every path stays on loopback.
        "FAIRRING_MACHINE_ID": f"machine-{rank // local}",
        # Each process its own NCCL host, so that NCCL takes several on the one GPU, over loopback.
        **shared_gpu_env(rank, "fairring-gpu-check", loopback=True),
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


def check_phases(args: argparse.Namespace) -> list[str]:
    return ["--check-sizes", ",".join(str(n) for n in args.check_size_list), "--order-checks"]


def bench_phases(args: argparse.Namespace, sizes: list[int]) -> list[str]:
    """The bench's phases: throughput at `sizes`, then the correctness checks."""
    return [
        "--sizes", ",".join(str(s) for s in sizes), *check_phases(args),
        "--iters", str(args.iters), "--warmup", str(args.warmup),
    ]  # fmt: skip


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
