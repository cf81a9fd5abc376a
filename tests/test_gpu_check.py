"""Smoke test of the GPU check (`make gpu-check`) in its CPU mode: the same stages on CPU tensors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gpu_tools
from fairring.bench.netns import netns_available
from nixl_support import NIXL_MISSING

NETNS = netns_available()[0]

ROOT = Path(__file__).parents[1]
MiB = 1024 * 1024


# The stages, each by its name in the report and its key for --only.
STAGES = {
    "contract: tests/test_cuda.py -k synchronous (every kind, async_op False and True, 2 x 2)": "contract",
    "fsdp2: GPT-124M by FSDP2 (2 x 2, 2 x 4) and DDP (2 x 4), NICs at 10gbit, MPS where it starts": "fsdp2",
    "versus NCCL: 2 hosts x 4 and x 8 ranks, NICs shaped to 10 and 25 Gbit/s, MPS where it starts": "versus",
    "tests: tests/test_cuda.py": "tests",
    "correctness: 4 processes as 2 machines x 2 ranks": "worlds",
    "correctness: 6 processes as 3 machines x 2 ranks, as an NCCL job starts (pg_options, device_id)": "worlds",
    "compare: fairring, NCCL, Gloo on 2 machines x 2 ranks": "compare",
    "compare: fairring, NCCL, Gloo on 2 machines x 1 ranks": "compare",
    "failure: rank 3 of 2 machines x 2 ranks killed mid-stream": "failure",
    "bench: 2 processes as 2 machines": "bench",
    "training: the study's quick part on 2 machines x 2 ranks": "training",
    "stress: cuda_basic, large slices": "stress",
    "validate: fairring.validate on 2 machines x 2 ranks": "validate",
    "nixl: 2 processes as 2 machines on the NIXL rails": "nixl",
}
# Stages that cannot run here say why and are skipped; that is no pass of them.
CANNOT_RUN = {"contract", "tests"} | (set() if NETNS else {"versus"}) | ({"nixl"} if NIXL_MISSING else set())


def cpu_check(tmp_path: Path, only: set[str]) -> tuple[str, dict[str, Any]]:
    """`python -m benchmarks.gpu_check --device cpu --quick --only ...`: its report, which must say PASSED, and the
    report's data, in which the stages of `only` ran (those that can here) and every other was skipped."""
    report = tmp_path / "report.md"
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--quick", "--report", str(report)]
    command += ["--budget", "220", "--only", ",".join(sorted(only))]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert report.exists(), run.stdout + run.stderr
    text = report.read_text()
    assert run.returncode == 0, text
    assert text.startswith("# fairring GPU check: PASSED\n")
    data = json.loads(text.rsplit("```json\n", 1)[1].rsplit("\n```", 1)[0])
    assert data["passed"] is True and data["device"] == "cpu" and data["skipped_for_budget"] == []
    for key in ("python_executable", "torch_cuda", "cuda_home", "compiler", "nvcc", "nproc"):
        assert data["environment"][key], key
    statuses = {stage["name"]: stage["status"] for stage in data["stages"]}
    assert statuses == {
        "build": "skipped",
        **{name: "ok" if key in only - CANNOT_RUN else "skipped" for name, key in STAGES.items()},
    }
    return text, data


@pytest.mark.timeout(240)
def test_gpu_check_on_cpu_versus_the_baseline_on_shaped_hosts(tmp_path: Path) -> None:
    """Against the baseline (Gloo on CPU tensors) on shaped hosts: the engine, the baseline and auto's routing,
    each result right; --quick runs 2x2 at 10 Gbit/s and 256 KiB only, and no MPS on the CPU."""
    if not NETNS:
        pytest.skip("network namespaces cannot be made here (the stage says why, and is skipped)")
    text, data = cpu_check(tmp_path, {"versus"})
    versus = data["versus"]
    assert versus["mps"] == "not tried (--device cpu)" and versus["netns"] == "available", versus
    # --quick on the CPU: one part, 2x2 at 10 Gbit/s, all three collectives in one launch; no NCCL to tune.
    assert sorted(versus["parts"]) == ["2x2 at 10gbit"] and "nccl_tuning" not in versus, versus
    collectives = versus["parts"]["2x2 at 10gbit"]["collectives"]
    assert sorted(collectives) == ["all_gather", "all_reduce", "reduce_scatter"], versus
    for collective, part in collectives.items():
        assert sorted((row["backend"], row["bytes"]) for row in part["rows"]) == [
            ("fairring", 256 * 1024),
            ("fairring-auto", 256 * 1024),
            ("gloo", 256 * 1024),
        ], (collective, part)
        assert all(row["correct"] and row["median_s"] > 0 for row in part["rows"]), part
        assert part["auto"]["auto_reason"], part
        assert f"{collective}, 2x2 at 10gbit (machines x ranks, NIC rate):" in text
    # 8 buckets back to back on that layout, the engine against the baseline, both right.
    overlap = versus["overlap"]["rows"]
    assert sorted(row["backend"] for row in overlap) == ["fairring", "gloo"], overlap
    assert all(row["correct"] and row["median_s"] > 0 for row in overlap), overlap
    assert "## Versus NCCL, the network the bottleneck" in text


@pytest.mark.timeout(240)
def test_gpu_check_on_cpu_correctness_compare_failure_and_bench(tmp_path: Path) -> None:
    text, data = cpu_check(tmp_path, {"worlds", "compare", "failure", "bench"})
    assert "All cases passed on every rank" in text
    correctness = data["bench"]["correctness"]
    assert correctness["all_passed"] is True and correctness["failed"] == []
    assert correctness["sizes"] == [1, 1000, 65537] and correctness["planned_per_rank"] == 40 * 3
    rows = data["bench"]["throughput"]
    assert [row["bytes"] for row in rows] == [64 * 1024, MiB]
    for row in rows:
        for part in ("engine", "reference_sequential", "reference_concurrent"):
            assert row[part]["correct"] is True and row[part]["median_s"] > 0, (part, row)
        assert row["algbw_GBps"] > 0 and row["busbw_GBps"] == row["algbw_GBps"]  # 2(n-1)/n = 1 for n = 2
        assert row["fraction_of_sequential"] > 0 and row["fraction_of_concurrent"] > 0
    for stats in data["bench"]["engine_stats"].values():
        assert stats["ops"] > 0 and stats["rail_bytes_sent"] == stats["rail_bytes_received"] > 0

    # Every rank of every layout checked every case, on the engine, with its local steps where it has some.
    assert sorted(data["worlds"]) == ["2x2", "3x2"]
    for spec, summary in data["worlds"].items():
        machines, _, local = spec.partition("x")
        world = int(machines) * int(local or 1)
        assert summary["problems"] == [], spec
        assert summary["correctness"]["all_passed"] is True and summary["correctness"]["planned_per_rank"] == 120
        assert sorted(summary["engine_stats"]) == [str(rank) for rank in range(world)]
        # The order checks on every rank: 18 more engine ops on the world group (2 on the same memory,
        # 2 back to back, 1 for a coalescing block of 3, which torch hands over as one
        # allreduce_coalesced, and 13 beside a second group on another thread).
        assert summary["order_checks"] == {"ranks": world, "all_passed": True}, spec
        for stats in summary["engine_stats"].values():
            assert stats["ops"] == 138 and stats["flat_ops"] == 0, (spec, stats)
            assert (stats["local_steps"] == "none") == (not local), (spec, stats)

    # Side by side on 2x2 and 2x1: on CPU tensors fairring and Gloo (NCCL needs CUDA), every result right.
    assert sorted(data["compare"]) == ["2x1", "2x2"]
    for compare in data["compare"].values():
        assert compare["problems"] == [] and compare["contenders"] == ["fairring", "gloo"]
        assert [row["bytes"] for row in compare["rows"]] == [64 * 1024, MiB]
        for row in compare["rows"]:
            assert row["fairring"]["correct"] and row["gloo"]["correct"] and row["fairring_vs_gloo"] > 0

    # Rank 3 killed: ranks 0-2 each raised an error naming it, within the op's timeout, and tore down.
    failure = data["failure"]
    assert failure["problems"] == [] and sorted(failure["outcomes"]) == ["0", "1", "2"], failure
    for outcome in failure["outcomes"].values():
        assert outcome["names_victim"] and outcome["seconds"] < 35 and outcome["destroy_seconds"] < 15, outcome
        # The failed group refuses later work, with the cause, instead of running it.
        assert outcome["later_broadcast_seconds"] < 5 and "rank 3" in outcome["later_broadcast"], outcome


@pytest.mark.timeout(240)
def test_gpu_check_on_cpu_fsdp2(tmp_path: Path) -> None:
    text, data = cpu_check(tmp_path, {"fsdp2"})
    # The FSDP2 stage's flow, on the tiny transformer (--quick: 2 x 2 only), shaped hosts where they can be
    # made: fairring and the baseline, losses in agreement, the host's issue time beside each step's.
    fsdp2 = data["fsdp2"]
    assert sorted((row["layout"], row["backend"]) for row in fsdp2["rows"]) == [("2x2", "fairring"), ("2x2", "gloo")]
    assert all(0 < row["issue_s"] <= row["median_s"] * 1.5 for row in fsdp2["rows"]), fsdp2
    assert "| layout | parallel | backend | step s | issued s |" in text


@pytest.mark.timeout(240)
def test_gpu_check_on_cpu_training(tmp_path: Path) -> None:
    _, data = cpu_check(tmp_path, {"training"})
    # The training study's quick part: both tiny models (the transformer under DDP and FSDP2) on both
    # backends, losses in agreement.
    rows = data["training"]["rows"]
    assert sorted((row["model"], row["backend"]) for row in rows) == [
        ("cnn-tiny", "fairring"),
        ("cnn-tiny", "gloo"),
        ("gpt-tiny", "fairring"),
        ("gpt-tiny", "gloo"),
        ("gpt-tiny fsdp2", "fairring"),
        ("gpt-tiny fsdp2", "gloo"),
    ], rows


@pytest.mark.timeout(240)
def test_gpu_check_on_cpu_stress_validate_and_nixl(tmp_path: Path) -> None:
    text, data = cpu_check(tmp_path, {"stress", "validate", "nixl"})
    if not NIXL_MISSING:
        nixl = data["nixl"]
        assert nixl["correctness"]["all_passed"] is True and nixl["correctness"]["failed"] == []
        assert [row["bytes"] for row in nixl["throughput"]] == [MiB] and nixl["throughput"][0]["algbw_GBps"] > 0
        assert all("nixl" in str(rails) for rails in [nixl["engine_rails"]]), nixl["engine_rails"]

    # fairring.validate under torchrun: both CPU paths at 64 KiB and 1 MiB, every element right, a verdict.
    validate = data["validate"]
    assert validate["problems"] == [] and sorted(validate["paths"]) == ["fairring", "gloo"], validate
    for rows in validate["paths"].values():
        assert [row["bytes"] for row in rows] == [64 * 1024, 256 * 1024, MiB] and all(r["wrong"] == 0 for r in rows)
    assert validate["verdict"].startswith("fairring's engine") and validate["engine_stats"]["ops"] > 0
    assert "## Validate" in text and f"Verdict: {validate['verdict']}" in text

    # The stress, scaled down: 4 rounds of 4 x 32 MiB in flight, slices of 4 MiB with cuda_basic required.
    stress = data["stress"]
    assert stress["problems"] == [] and stress["failed"] == []
    assert stress["settings"] == {
        "FAIRRING_SLICE_SIZE": "4MiB",
        "FAIRRING_TOTAL_MEMORY": "64MiB",
        "FAIRRING_CHANNELS": "cuda_basic",
    }
    assert (stress["ops"], stress["bytes"], stress["rounds"]) == (4, 32 * MiB, 4)
    assert stress["plan"]["slices"] == 8 and stress["plan"]["slice_numel"] * 4 == 4 * MiB
    assert len(stress["round_seconds"]) == 4 and min(stress["round_seconds"]) > 0
    for stats in stress["engine_stats"].values():
        assert stats["ops"] == 16 and stats["slices"] == 16 * 8, stats


def test_only_names_the_stages_it_knows(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--only", "worlds,tarining"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (
        run.returncode == 2
        and "--only: no stage tarining; the stages are contract,fsdp2,versus,tests,worlds," in run.stderr
    )


def test_a_check_cut_short_has_reported_the_stages_it_ran(tmp_path: Path) -> None:
    """The report is written after each stage: killed after its first, it says what ran and what did not."""
    report = tmp_path / "report.md"
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--quick", "--report", str(report)]
    command += ["--only", "compare,failure"]  # a short first stage: its 2x2 comparison
    # SIGINT's default restored in the check: a test run started in the background (a CI script's `&`)
    # ignores it, and an ignored signal stays ignored across exec, so the interrupt would never land.
    check = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not report.exists() and check.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        # SIGINT: the check's own cleanup (its ranks, their scratch folder) runs as it stops.
        check.send_signal(signal.SIGINT)
        try:
            check.wait(timeout=30)
        except subprocess.TimeoutExpired:
            check.kill()
            check.wait(timeout=30)
    text = report.read_text()
    assert text.startswith("# fairring GPU check: INCOMPLETE"), text[:300]
    data = json.loads(text.rsplit("```json\n", 1)[1].rsplit("\n```", 1)[0])
    statuses = [(stage["status"], stage["detail"]) for stage in data["stages"]]
    # The first stage after the build that runs here (not skipped, saying why) ran to its end.
    ran = [status for status in statuses[1:] if not status[1].startswith("skipped")]
    assert ran and ran[0][0] == "ok", statuses
    assert ("skipped", "not run yet") in statuses, statuses


def _deb(folder: Path, scratch: Path, package: str, program: str) -> None:
    """A package `package` holding /bin/`program`, which prints "ok"."""
    root = scratch / package
    (root / "DEBIAN").mkdir(parents=True)
    fields = f"Package: {package}\nVersion: 1\nArchitecture: all\nMaintainer: fairring <none@localhost>\n"
    (root / "DEBIAN" / "control").write_text(fields + "Description: a test package\n")
    (root / "bin").mkdir()
    script = root / "bin" / program
    script.write_text("#!/bin/sh\necho ok\n")
    script.chmod(0o755)
    subprocess.run(["dpkg-deb", "-b", str(root), str(folder / f"{package}.deb")], check=True, capture_output=True)


def test_carried_tools_unpack_only_what_the_machine_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU machine's iproute2 (benchmarks/gpu_tools.py): a missing package is unpacked beside, never
    over /, and put on PATH; one the machine has is left alone, so it shadows nothing."""
    if shutil.which("dpkg-deb") is None or subprocess.run(["dpkg", "-s", "coreutils"], capture_output=True).returncode:
        pytest.skip("needs dpkg-deb and an installed coreutils package (a Debian or Ubuntu machine)")
    folder, scratch = tmp_path / "tools", tmp_path / "scratch"
    folder.mkdir()
    _deb(folder, scratch, "fairring-test-tool", "fairring-test-tool")
    _deb(folder, scratch, "coreutils", "fairring-test-shadow")  # installed here: must stay packed
    monkeypatch.setenv("PATH", os.environ["PATH"])
    monkeypatch.setenv("LD_LIBRARY_PATH", os.environ.get("LD_LIBRARY_PATH", ""))
    monkeypatch.setattr(gpu_tools.tempfile, "tempdir", str(tmp_path))
    assert "no packages in" in gpu_tools.provide(tmp_path / "empty", ("fairring-test-tool",))
    said = gpu_tools.provide(folder, ("fairring-test-tool",))
    assert said.startswith("unpacked fairring-test-tool from") and "still missing" not in said, said
    assert subprocess.run(["fairring-test-tool"], capture_output=True, text=True).stdout == "ok\n"
    assert shutil.which("fairring-test-shadow") is None
    assert gpu_tools.provide(folder, ("fairring-test-tool",)) == "installed"


def test_a_stage_of_parts_reports_each_part_as_it_ends() -> None:
    """A stage that reports progress (the versus stage, after each layout) has the report rewritten with what it
    found so far, marked running, before its own end rewrites it again."""
    from benchmarks.gpu_check.budget import Step, run_steps
    from benchmarks.gpu_check.stage import Stage

    def two_parts(seconds: float, progress) -> tuple[Stage, dict]:
        progress(Stage("parts"), {"parts": ["2x4"]})
        return Stage("parts", "ok"), {"parts": ["2x4", "2x8"]}

    written: list[tuple[str, dict]] = []
    step = Step("parts", "parts", 100.0, 10.0, two_parts, reports_progress=True)
    run_steps(
        [step], time.monotonic() + 100, lambda stages, summaries, _: written.append((stages[0].status, summaries))
    )
    assert written == [("running", {"parts": {"parts": ["2x4"]}}), ("ok", {"parts": {"parts": ["2x4", "2x8"]}})]


def test_the_training_stage_runs_ddp_beside_fsdp2_on_2x4() -> None:
    """On 2 x 4 the FSDP2 stage also trains by DDP (issue 63's figure), in the same launch; 2 x 2 is FSDP2's only."""
    from benchmarks.gpu_check.fsdp2 import LAYOUTS, fsdp2_arguments
    from benchmarks.versus_nccl import Mps

    by_layout = {f"{m}x{r}": fsdp2_arguments("cuda", f"{m}x{r}", ways, Mps("off"), True) for (m, r), ways in LAYOUTS}
    assert by_layout["2x2"][by_layout["2x2"].index("--parallelism") + 1] == "fsdp2"
    assert by_layout["2x4"][by_layout["2x4"].index("--parallelism") + 1] == "both"
    assert "gpt-124m" in by_layout["2x4"] and "--cuda" in by_layout["2x4"]


def test_the_versus_report_names_nccl_tuning_and_each_part() -> None:
    """The GPU-only parts of the versus stage's report (NCCL's socket tuning, parts at 25 Gbit/s), which the
    CPU flow never produces, from a summary shaped as the stage builds it."""
    from benchmarks import versus_nccl
    from benchmarks.gpu_check.report import percent, table

    row = {"bytes": 4 << 20, "median_s": 0.004, "speedup_vs_baseline": 1.2, "correct": True, "busbw_GBps": 1.0}
    found = {"rows": [{**row, "backend": "fairring"}], "engine_at_least_as_fast_from": 4 << 20, "auto": None}
    summary = {
        "device": "cuda",
        "nccl_tuning": {"tried": [{"setting": "NCCL's defaults", "nccl_ms": 41.0}], "kept": "NCCL's defaults"},
        "parts": {"2x8 at 25gbit": {"collectives": {"all_gather": found}}},
        "left_out": ["2x4 at 25gbit left out: 3 s of the stage left"],
    }
    text = "\n".join(versus_nccl.lines(summary, table, percent))
    assert "NCCL's socket settings: NCCL's defaults (its all-reduce at 64MiB: NCCL's defaults: 41.0 ms)" in text
    assert "all_gather, 2x8 at 25gbit (machines x ranks, NIC rate):" in text
    assert "from 4MiB up." in text and "2x4 at 25gbit left out" in text
    assert "For the default threshold: from 4MiB (inclusive) the engine is at least as fast" in text
    # One collective of one part that the engine loses at its largest size: no threshold is offered.
    lost = {**found, "engine_at_least_as_fast_from": None}
    summary["parts"]["2x4 at 10gbit"] = {"collectives": {"all_gather": found, "reduce_scatter": lost}}
    text = "\n".join(versus_nccl.lines(summary, table, percent))
    assert "slower than the baseline at the largest size measured in reduce_scatter on 2x4 at 10gbit;" in text
