"""The commands a stage runs: each in a session of its own, bounded in time, killed with all it started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .stage import Stage, display, tail

# The checkout's root: every command runs there, so `python -m benchmarks.<name>` and the in-place build import.
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Finished:
    returncode: int | None  # None: killed at its time limit
    output: str
    seconds: float


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


def read_results(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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
