"""Smoke test of the main job: the benchmark on tiny sizes, through torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fairring.bench.netns import netns_available

ROOT = Path(__file__).parents[1]


def run_bench(arguments: list[str], output: Path) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    command = [sys.executable, "-m", "fairring.bench", *arguments, "--json", str(output), "--timeout", "240"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    return run, json.loads(output.read_text())["records"]


def test_bench_runs_and_checks_results(tmp_path: Path) -> None:
    run, records = run_bench(["-b", "1KiB", "-e", "64KiB", "-f", "64", "-n", "2", "-w", "1"], tmp_path / "r.json")
    assert "fairring" in run.stdout and "gloo" in run.stdout
    assert {(r["backend"], r["bytes"]) for r in records} == {
        (backend, size) for backend in ("gloo", "fairring") for size in (1024, 65536)
    }
    for record in records:
        assert record["correct"] is True
        assert (record["machines"], record["ranks_per_machine"]) == (2, 2)
        assert record["median_s"] > 0 and record["busbw_GBps"] == record["algbw_GBps"] * 2 * 3 / 4
        assert record["bound_s"] is None and record["link"] is None


def test_every_study_on_shaped_hosts(tmp_path: Path) -> None:
    available, reason = netns_available()
    if not available:
        pytest.skip(f"network namespaces unavailable: {reason}")
    arguments = ["--study", "all", "--hosts", "2", "--ranks-per-host", "1", "--link", "100mbit", "--sizes", "256KiB"]
    arguments += ["--buckets", "3", "--bucket-size", "64KiB", "--inflight", "1,2", "--scaling-size", "64KiB"]
    arguments += ["-n", "2", "-w", "1", "--plots", str(tmp_path)]
    _, records = run_bench(arguments, tmp_path / "r.json")
    assert all(record["correct"] is True for record in records)
    by_study = {study: [r for r in records if r["study"] == study] for study in ("single", "overlap", "scaling")}
    for record in by_study["single"]:
        # 2(M-1)/M x S through a 12.5 MB/s NIC. (A transfer this small partly
        # rides tbf's burst, so it may beat the bound: only check its formula.)
        assert record["bound_s"] == pytest.approx(256 * 1024 / 12.5e6)
        assert record["fraction_of_bound_speed"] == pytest.approx(record["bound_s"] / record["median_s"])
    assert sorted({r["inflight"] for r in by_study["overlap"]}) == [1, 2]
    assert all(r["buckets"] == 3 for r in by_study["overlap"])
    assert sorted({r["machines"] for r in by_study["scaling"]}) == [1, 2]
    for study in by_study:
        assert (tmp_path / f"{study}.png").stat().st_size > 0 and (tmp_path / f"{study}.svg").exists()
