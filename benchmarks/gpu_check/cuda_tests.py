"""The contract and tests stages: tests/test_cuda.py, whose one-GPU tests must pass, not skip, where a GPU is
visible. The contract stage runs first of all the CUDA stages: synchronous ops of every kind on real NCCL
(issue 62), which a job meets in its first step; the tests stage runs the rest."""

from __future__ import annotations

import argparse
import re
import sys

from .processes import run_bounded
from .stage import Stage, display, tail

TEST_COMMAND = ["-m", "pytest", "tests/test_cuda.py", "-rs", "-s", "-p", "no:cacheprovider"]
TESTS_STAGE = "tests: tests/test_cuda.py"
# The contract stage's tests, by pytest's -k; the tests stage runs the others.
CONTRACT_SELECTION = "synchronous"
CONTRACT_STAGE = f"contract: tests/test_cuda.py -k {CONTRACT_SELECTION} (every kind, async_op False and True, 2 x 2)"


def pytest_summary(output: str) -> str:
    """pytest's last line, e.g. '2 passed, 1 skipped in 80.1s'."""
    for line in reversed(output.splitlines()):
        match = re.fullmatch(r"=+ (.*\bin [\d.]+s.*?) =+", line.strip())
        if match:
            return match.group(1)
    return "no pytest summary line (killed, or it did not start)"


def run_tests(args: argparse.Namespace, timeout: float, contract: bool = False) -> Stage:
    """The contract stage's tests (`contract`), or the tests stage's: the others."""
    selection = CONTRACT_SELECTION if contract else f"not {CONTRACT_SELECTION}"
    command = [sys.executable, *TEST_COMMAND, "-k", selection]
    stage = Stage(CONTRACT_STAGE if contract else TESTS_STAGE, commands=[display(command)])
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
