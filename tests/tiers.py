"""Test tiers, each test's time budget, and where the suite's time goes (a pytest plugin).

A test's tier is its marker, never its file:

- no tier marker: CI's suite (`make test`). Each test must finish, its setup and teardown
  included, within the budget (BUDGET_SECONDS, FAIRRING_TEST_BUDGET_S overrides it, 0 turns
  it off); one that takes longer fails, saying so, unless it is marked `extended`.
- `extended`: long sweeps, stress runs and the layouts beyond CI's, outside CI
  (`make test-extended`). Each guards a class of bug that a cheaper test in CI also guards.

The summary lists the slowest tests with the share of the machine's CPUs busy while each
ran: a test that is slow on an idle machine is waiting (on a timeout, a sleep, a peer), and
is made faster by waiting less, not by a faster machine.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

BUDGET_SECONDS = 60.0
SLOWEST_SHOWN = 25
# Registered, with their meaning, in pyproject.toml (files outside tests/, such as .ci/sanitize_check.py, run
# without this plugin, and pytest's -m there must still know them).
TIER_MARKERS = ("extended",)


def budget_seconds() -> float:
    return float(os.environ.get("FAIRRING_TEST_BUDGET_S", BUDGET_SECONDS))


def busy_cpu_seconds() -> float:
    """The machine's CPU time spent not idle since boot, over all CPUs (every process, ranks included)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / os.sysconf("SC_CLK_TCK")


@dataclass
class TestTime:
    nodeid: str
    seconds: float = 0.0
    busy_cpu_seconds: float = 0.0
    tier: str = "ci"
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def busy_share(self) -> float:
        """Of the machine's CPUs, the share that was busy while the test ran."""
        return self.busy_cpu_seconds / max(self.seconds * (os.cpu_count() or 1), 1e-9)


def tier_of(item: pytest.Item) -> str:
    return next((name for name in TIER_MARKERS if item.get_closest_marker(name)), "ci")


class Timings:
    def __init__(self, json_path: str | None) -> None:
        self.json_path = json_path
        self.by_test: dict[str, TestTime] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> object:
        self.by_test[item.nodeid] = TestTime(item.nodeid, tier=tier_of(item))
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> object:
        yield from self._phase(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> object:
        yield from self._phase(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> object:
        yield from self._phase(item, "teardown")

    def _phase(self, item: pytest.Item, phase: str) -> object:
        started, busy = time.monotonic(), busy_cpu_seconds()
        yield
        entry = self.by_test[item.nodeid]
        entry.phases[phase] = time.monotonic() - started
        entry.seconds += entry.phases[phase]
        entry.busy_cpu_seconds += busy_cpu_seconds() - busy

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> object:
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        budget = budget_seconds()
        entry = self.by_test.get(item.nodeid)
        if call.when != "teardown" or not budget or entry is None or entry.tier != "ci" or not report.passed:
            return
        if entry.seconds > budget:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} took {entry.seconds:.1f} s ({self._phases(entry)}), over CI's budget of "
                f"{budget:.0f} s a test: make it wait less (shorter timeouts, fewer repeats), split it, or mark "
                "it `extended` (tests/tiers.py) if a cheaper test of the same class stays in CI"
            )

    @staticmethod
    def _phases(entry: TestTime) -> str:
        return ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in entry.phases.items())

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        timed = sorted(self.by_test.values(), key=lambda entry: entry.seconds, reverse=True)
        if not timed:
            return
        total = sum(entry.seconds for entry in timed)
        terminalreporter.section(f"the {min(SLOWEST_SHOWN, len(timed))} slowest tests (CPUs busy: the machine's)")
        for entry in timed[:SLOWEST_SHOWN]:
            terminalreporter.write_line(
                f"{entry.seconds:7.1f} s  CPUs busy {entry.busy_share:4.0%}  {entry.nodeid}  ({self._phases(entry)})"
            )
        terminalreporter.write_line(f"{total:7.1f} s  in {len(timed)} tests")
        if self.json_path:
            records = [{**asdict(entry), "busy_share": entry.busy_share} for entry in timed]
            Path(self.json_path).write_text(json.dumps(records, indent=1))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--timings-json", default=None, help="write each test's time and CPU use to this file")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Timings(config.getoption("--timings-json")), "fairring-timings")
