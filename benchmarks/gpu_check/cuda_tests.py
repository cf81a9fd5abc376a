"""The tests stage: tests/test_cuda.py, whose one-GPU tests must pass, not skip, where a GPU is visible."""

from __future__ import annotations

import argparse
import re
import sys

from .processes import run_bounded
from .stage import Stage, display, tail

TEST_COMMAND = ["-m", "pytest", "tests/test_cuda.py", "-rs", "-s", "-p", "no:cacheprovider"]
TESTS_STAGE = "tests: tests/test_cuda.py"


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
