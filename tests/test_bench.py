"""Smoke test of the main job: the benchmark on tiny sizes, through torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_runs_and_checks_results(tmp_path: Path) -> None:
    output = tmp_path / "records.json"
    command = [sys.executable, "-m", "fairring.bench", "--sizes", "1KiB,64KiB", "--iters", "2", "--warmup", "1"]
    command += ["--json", str(output), "--timeout", "240"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "fairring" in run.stdout and "gloo" in run.stdout
    records = json.loads(output.read_text())["records"]
    assert {(r["backend"], r["bytes"]) for r in records} == {
        (backend, size) for backend in ("gloo", "fairring") for size in (1024, 65536)
    }
    for record in records:
        assert record["correct"] is True
        assert (record["machines"], record["ranks_per_machine"]) == (2, 2)
        assert record["median_s"] > 0 and record["busbw_GBps"] == record["algbw_GBps"] * 2 * 3 / 4
