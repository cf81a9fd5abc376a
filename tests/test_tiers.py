"""The per-test time budget (tests/tiers.py) fails a slow CI-tier test, and only that: run on a tiny suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent

SUITE = """
import time

import pytest


def test_quick() -> None:
    pass


def test_slow_in_ci() -> None:
    time.sleep(1.5)


@pytest.mark.extended
def test_slow_and_extended() -> None:
    time.sleep(1.5)
"""


@pytest.mark.timeout(120)
def test_a_ci_test_over_the_budget_fails_and_an_extended_one_does_not(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\npytest_plugins = ('tiers',)\n"
    )
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {**os.environ, "FAIRRING_TEST_BUDGET_S": "1"}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-W", "ignore", str(tmp_path)]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)
    out = run.stdout
    assert run.returncode == 1, out
    assert "PASSED test_suite.py::test_quick" in out, out
    assert "PASSED test_suite.py::test_slow_and_extended" in out, out
    assert "ERROR test_suite.py::test_quick" not in out and "ERROR test_suite.py::test_slow_and" not in out, out
    # The negative control: the same sleep, unmarked, over a 1 s budget.
    # (pytest reports its call passed, then an error at its teardown, where the budget is checked.)
    assert "ERROR test_suite.py::test_slow_in_ci" in out and "3 passed, 1 error" in out, out
    assert "over CI's budget of 1 s a test" in out, out
    assert "slowest tests" in out and "test_suite.py::test_slow_in_ci" in out.split("slowest tests", 1)[1], out
