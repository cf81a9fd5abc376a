"""Smoke test of the GPU check (`make gpu-check`) in its CPU mode: the same bench on CPU tensors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_gpu_check_on_cpu_writes_a_passing_report(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    command = [sys.executable, "-m", "fairring.bench.gpu_check", "--device", "cpu", "--quick", "--report", str(report)]
    command += ["--budget", "220"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert report.exists(), run.stdout + run.stderr
    text = report.read_text()
    assert run.returncode == 0, text
    assert text.startswith("# fairring GPU check: PASSED")
    assert "All cases passed on every rank" in text
    data = json.loads(text.rsplit("```json\n", 1)[1].rsplit("\n```", 1)[0])
    assert data["passed"] is True and data["device"] == "cpu"
    correctness = data["bench"]["correctness"]
    assert correctness["all_passed"] is True and correctness["failed"] == []
    assert correctness["sizes"] == [1, 1000, 65537] and correctness["planned_per_rank"] == 40 * 3
    rows = data["bench"]["throughput"]
    assert [row["bytes"] for row in rows] == [64 * 1024, 1024 * 1024]
    for row in rows:
        for part in ("engine", "reference_sequential", "reference_concurrent"):
            assert row[part]["correct"] is True and row[part]["median_s"] > 0, (part, row)
        assert row["algbw_GBps"] > 0 and row["busbw_GBps"] == row["algbw_GBps"]  # 2(n-1)/n = 1 for n = 2
        assert row["fraction_of_sequential"] > 0 and row["fraction_of_concurrent"] > 0
    for stats in data["bench"]["engine_stats"].values():
        assert stats["ops"] > 0 and stats["rail_bytes_sent"] == stats["rail_bytes_received"] > 0
