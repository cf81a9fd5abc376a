"""Smoke test of fairring/bench/init_time.py (benchmarks/init_time.py runs it): one run per backend on 2 machines
x 2 ranks; nothing about speed."""

from __future__ import annotations

import pytest

from fairring.bench import init_time


@pytest.mark.timeout(180)
def test_init_time_runs_both_backends_and_checks_all_reduces(capsys: pytest.CaptureFixture[str]) -> None:
    report = init_time.main(["--worlds", "4", "--ranks-per-machine", "2", "--repeats", "1", "--timeout", "120"])

    assert sorted(run.backend for run in report.runs) == sorted(init_time.BACKENDS)
    for run in report.runs:
        assert (run.machines, run.ranks_per_machine, run.world_size) == (2, 2, 4)
        assert len(run.ranks) == 4
        # Every rank checked its all-reduce against torch's sum of all inputs (a wrong one raises before this).
        assert all(rank["correct"] is True for rank in run.ranks)
        assert all(rank[timing] > 0 for rank in run.ranks for timing in init_time.TIMINGS)
        assert run.keys_after_all_reduce >= run.keys_after_init > 0

    rows = {row.measure: row for row in report.tables[4]}
    assert set(init_time.TIMINGS) <= set(rows)
    for timing in init_time.TIMINGS:
        for backend in init_time.BACKENDS:
            assert rows[timing].median[backend] > 0 and rows[timing].max[backend] >= rows[timing].median[backend]

    out = capsys.readouterr().out
    assert out.startswith("command: ") and "torch " in out and "cores" in out
    assert "world 4 = 2 machines x 2 ranks" in out and "ratio med" in out
