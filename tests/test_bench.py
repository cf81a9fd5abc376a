"""Smoke test of the main job: the benchmark on tiny sizes, through torchrun."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from documented_logs import assert_reads_as_documented
from test_timeline import write_trace

import fairring.bench.__main__ as bench
from fairring._config import RAILS_TRANSPORT
from fairring._dispatch import LADDER
from fairring.bench import netns
from fairring.bench.netns import netns_available

ROOT = Path(__file__).parents[1]
# The bench's name for fairring's records: the rails' transport is in it unless it is TensorPipe's
# (`make test-nixl` runs the bench on NIXL).
FAIRRING = "fairring-nixl" if os.environ.get(RAILS_TRANSPORT) == "nixl" else "fairring"


def run_bench(arguments: list[str], output: Path) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    command = [sys.executable, "-m", "fairring.bench", *arguments, "--json", str(output), "--time-limit", "240"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    return run, json.loads(output.read_text())["records"]


@pytest.mark.timeout(300)
def test_bench_runs_and_checks_results(tmp_path: Path) -> None:
    arguments = ["--loopback", "-b", "1KiB", "-e", "64KiB", "-f", "64", "-n", "2", "-w", "1"]
    run, records = run_bench([*arguments, "--timeline", "--plots", str(tmp_path)], tmp_path / "r.json")
    assert FAIRRING in run.stdout and "gloo" in run.stdout
    assert {(r["backend"], r["bytes"]) for r in records} == {
        (backend, size) for backend in ("gloo", FAIRRING) for size in (1024, 65536)
    }
    for record in records:
        assert record["correct"] is True
        assert (record["machines"], record["ranks_per_machine"]) == (2, 2)
        assert record["median_s"] > 0 and record["busbw_GBps"] == record["algbw_GBps"] * 2 * 3 / 4
        assert record["bound_s"] is None and record["link"] is None
    last = run.stdout.splitlines()[-1]
    assert last.startswith("On loopback") and "all_reduce of 64 KiB took" in last and "Gloo's speed" in last
    # An extension that writes no traces yet says so; one that does gets its last op drawn.
    timeline = [line for line in run.stdout.splitlines() if line.startswith("timeline: ")]
    if "no trace files" in "".join(timeline):
        assert timeline == [f"timeline: no trace files in {tmp_path / 'timeline-0'}; {bench.NO_TRACES}"]
    else:
        assert timeline == [f"timeline: {tmp_path / 'timeline-0'}.png", f"timeline: {tmp_path / 'timeline-0'}.svg"]
    assert "OMP_NUM_THREADS" not in run.stdout + run.stderr


@pytest.mark.timeout(300)
def test_bench_times_the_other_collectives(tmp_path: Path) -> None:
    """--collective, two in one launch: every result checked, sizes of the N-chunk buffer, (N-1)/N bus
    bandwidth, a table for each."""
    collectives = ("reduce_scatter", "all_gather")
    arguments = ["--loopback", "--sizes", "64KiB", "-n", "2", "-w", "1", "--collective", ",".join(collectives)]
    run, records = run_bench([*arguments, "--plots", str(tmp_path)], tmp_path / "r.json")
    assert {(r["backend"], r["bytes"], r["collective"]) for r in records} == {
        (backend, 65536, collective) for backend in ("gloo", FAIRRING) for collective in collectives
    }
    for record in records:
        assert record["correct"] is True
        assert record["busbw_GBps"] == pytest.approx(record["algbw_GBps"] * 3 / 4)
    for collective in collectives:
        assert f"CPU float32 {collective}" in run.stdout
    assert "reduce_scatter of 64 KiB took" in run.stdout.splitlines()[-1]


@pytest.mark.timeout(300)
def test_dispatch_study_puts_autos_choice_next_to_both_paths(tmp_path: Path) -> None:
    """CI's share of --study dispatch: one layout, one timed iteration per size, on loopback."""
    arguments = ["--study", "dispatch", "--loopback", "--layouts", "2x1", "-n", "1", "-w", "0"]
    arguments += ["--plots", str(tmp_path)]
    run, records = run_bench(arguments, tmp_path / "d.json")
    assert {r["backend"] for r in records} == {"gloo", FAIRRING, "fairring-auto"}
    assert sorted({r["bytes"] for r in records}) == list(LADDER) and all(r["correct"] for r in records)
    [auto] = {(r["auto_threshold"], r["auto_ceiling"]) for r in records if r["backend"] == "fairring-auto"}
    lines = run.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dispatch, 2 machines x 1: auto measured for"))
    assert len(lines[start + 2 : start + 2 + len(LADDER)]) == len(LADDER)
    took = [line.split()[5] for line in lines[start + 2 : start + 2 + len(LADDER)]]
    # What the table says auto took is what its decision routes to.
    assert took == ["engine" if auto[0] <= size < auto[1] else "gloo" for size in LADDER]
    assert lines[start + 2 + len(LADDER)].strip().startswith("this sweep's own choice:")


@pytest.mark.timeout(300)
def test_the_summary_deploying_md_shows_is_what_its_command_logs(tmp_path: Path) -> None:
    available, reason = netns_available()
    if not available:
        pytest.skip(f"network namespaces unavailable: {reason}")
    arguments = ["--sizes", "4MiB,16MiB", "--link", "1gbit", "--set", "FAIRRING_LOG_LEVEL=INFO"]
    arguments += ["--set", "FAIRRING_FLAT_THRESHOLD=auto", "--set", "FAIRRING_AUTO_CACHE=off"]
    documented_command = " ".join((ROOT / "docs" / "deploying.md").read_text().split())
    assert f"(`python -m fairring.bench {' '.join(arguments)}`)" in documented_command
    run, records = run_bench([*arguments, "--plots", str(tmp_path)], tmp_path / "r.json")
    assert all(record["correct"] is True for record in records)
    [said] = [line for line in run.stderr.splitlines() if "what fairring did for this group" in line]
    assert_reads_as_documented(said, "docs/deploying.md", "what fairring did for this group")


@pytest.mark.timeout(300)
def test_every_study_on_shaped_hosts(tmp_path: Path) -> None:
    available, reason = netns_available()
    if not available:
        pytest.skip(f"network namespaces unavailable: {reason}")
    arguments = ["--study", "all", "--hosts", "2", "--ranks-per-host", "1", "--link", "100mbit", "--sizes", "256KiB"]
    arguments += ["--buckets", "3", "--bucket-size", "64KiB", "--inflight", "1,2", "--scaling-size", "64KiB"]
    arguments += ["-n", "2", "-w", "1", "--plots", str(tmp_path)]
    run, records = run_bench(arguments, tmp_path / "r.json")
    # No warnings: each host resolves its peers' addresses (NetnsCluster's hosts files), OMP_NUM_THREADS is set.
    assert run.stderr == ""
    assert all(record["correct"] is True for record in records)
    by_study = {study: [r for r in records if r["study"] == study] for study in ("single", "overlap", "scaling")}
    for record in by_study["single"]:
        # 2(M-1)/M x S through a 12.5 MB/s NIC. (A transfer this small partly
        # rides tbf's burst, so it may beat the bound: only check its formula.)
        assert record["bound_s"] == pytest.approx(256 * 1024 / 12.5e6)
        assert record["fraction_of_bound_speed"] == pytest.approx(record["bound_s"] / record["median_s"])
        # The busiest shaper passed at least the bound's payload per op, plus frame headers and
        # acknowledgements, but not much more (the barriers' and the protocols' few messages).
        payload = record["bound_s"] * 12.5e6
        assert payload * 1.02 < record["wire_bytes"] < payload * 1.25 + 64 * 1024
        assert record["link_busy"] == pytest.approx(record["wire_bytes"] / 12.5e6 / record["median_s"])
        assert 0 < record["cpu_busy"] <= 1.05
        assert record["mtu"] == 1500  # read from the host's NIC
    # The last run's (scaling, default settings) plan-shaping settings, defaults included.
    environment = json.loads((tmp_path / "r.json").read_text())["environment"]
    assert environment["fairring_settings"]["FAIRRING_MIN_SHARD_SIZE"] == 256 * 1024
    assert environment["fairring_settings"]["FAIRRING_SLICES_IN_FLIGHT"] == 4
    assert environment["fairring_plan"]["shortest_slice"] == 2 * 1024 * 1024  # half of 4 MiB
    assert sorted({r["inflight"] for r in by_study["overlap"]}) == [1, 2]
    assert all(r["buckets"] == 3 for r in by_study["overlap"])
    assert sorted({r["machines"] for r in by_study["scaling"]}) == [1, 2]
    for study in by_study:
        assert (tmp_path / f"{study}.png").stat().st_size > 0 and (tmp_path / f"{study}.svg").exists()
    sentences = run.stdout.splitlines()[-3:]
    assert all(
        s.startswith("Over 100 Mbit/s NICs") and "of the hierarchical bound (its busiest NIC" in s
        for s in sentences[:2]
    )
    assert "3 all_reduces of 64 KiB with 2 slice(s) in flight" in sentences[1]
    assert "all_reduce of 64 KiB on 2 machine(s)" in sentences[2]
    # The hosts files went with the namespaces.
    leftovers = os.listdir(netns.NETNS_ETC_DIR) if os.path.isdir(netns.NETNS_ETC_DIR) else []
    assert not [name for name in leftovers if name.startswith("fairring-")]


def _processes_with(variable: str) -> list[int]:
    """Processes whose environment holds `variable` (a unique NAME=value)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and variable.encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


@pytest.mark.timeout(120)
def test_a_terminated_run_stops_its_ranks_and_removes_its_hosts() -> None:
    available, reason = netns_available()
    if not available:
        pytest.skip(f"network namespaces unavailable: {reason}")
    tag = f"FAIRRING_BENCH_TEST_RUN={os.getpid()}-{time.monotonic_ns()}"
    command = [sys.executable, "-m", "fairring.bench", "--link", "100mbit", "--sizes", "64MiB", "-n", "1000"]
    bench_run = subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, tag.split("=")[0]: tag.split("=")[1]}
    )
    try:
        assert bench_run.stdout is not None
        for line in bench_run.stdout:  # the ranks are up once rank 0 prints the column names
            if "backend" in line:
                break
        hosts = [name for name in os.listdir(netns.NETNS_DIR) if name.startswith(f"fairring-{bench_run.pid:x}-")]
        assert hosts and _processes_with(tag)
        bench_run.terminate()
        assert bench_run.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if bench_run.poll() is None:
            bench_run.kill()
            bench_run.wait()
    assert not [name for name in os.listdir(netns.NETNS_DIR) if name.startswith(f"fairring-{bench_run.pid:x}-")]
    assert _processes_with(tag) == []


@pytest.mark.timeout(60)
def test_the_default_is_shaped_hosts_where_namespaces_can_be_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "netns_available", lambda: (True, ""))
    args = bench.parse_args([])
    assert (args.link, args.netns, args.default_hosts) == ("1gbit", True, True)
    assert args.size_list == [1 << 20, 4 << 20, 16 << 20, 64 << 20]
    assert bench.setup_line(args) is not None and "1 Gbit/s" in str(bench.setup_line(args))
    # Explicit flags keep their meaning, sizes included.
    args = bench.parse_args(["--netns", "-b", "4KiB", "-e", "32KiB"])
    assert (args.link, args.netns, args.size_list, bench.setup_line(args)) == (None, True, [4096, 32768], None)
    args = bench.parse_args(["--loopback"])
    assert (args.link, args.netns, args.size_list[0], args.size_list[-1]) == (None, False, 4096, 16 << 20)
    with pytest.raises(SystemExit):
        bench.parse_args(["--loopback", "--link", "1gbit"])
    # Jumbo frames are the emulated NICs'; loopback has none to set.
    assert bench.parse_args(["--link", "1gbit", "--mtu", "9000"]).mtu == 9000
    for wrong in (["--loopback", "--mtu", "9000"], ["--link", "1gbit", "--mtu", "100000"]):
        with pytest.raises(SystemExit):
            bench.parse_args(wrong)
    monkeypatch.setattr(bench, "netns_available", lambda: (False, "network namespaces need root"))
    args = bench.parse_args([])
    assert (args.link, args.netns, args.size_list[-1]) == (None, False, 16 << 20)
    assert str(bench.setup_line(args)).startswith("note: network namespaces are unavailable (network namespaces")


@pytest.mark.timeout(60)
def test_timeline_pictures_after_a_run(tmp_path: Path) -> None:
    folder = bench.timeline_folder(tmp_path, 3)
    assert folder == (tmp_path / "timeline-3").resolve() and folder.is_dir()
    assert bench.draw_timeline(folder) == [f"timeline: no trace files in {folder}; {bench.NO_TRACES}"]
    assert not folder.exists()
    folder = bench.timeline_folder(tmp_path, 3)
    for rank in range(2):
        write_trace(folder, rank, ops=2)
    assert bench.draw_timeline(folder) == [f"timeline: {folder}.png", f"timeline: {folder}.svg"]
    bench.timeline_folder(tmp_path, 3)  # A new run starts without the last one's traces.
    assert not list(folder.glob("*.json"))


def test_the_training_reading_names_the_baseline_that_ran() -> None:
    """On a GPU the study's baseline is NCCL: its one-line reading must not call it Gloo."""
    from fairring.bench.training import reading

    def real(baseline: str) -> dict:
        return {"backend": "fairring", "part": "real", "model": "gpt-tiny", "parallel": "fsdp2", "link": None,
                "speedup_vs_baseline": 1.06, "loss_gap": 0.0, "baseline": baseline}  # fmt: skip

    assert "gpt-tiny fsdp2 1.06x (loopback) NCCL's speed" in reading([real("nccl")], argparse.Namespace())
    assert "Gloo's speed" in reading([real("gloo")], argparse.Namespace())


@pytest.mark.parametrize(
    "arguments",
    [["--collective", "all_reduce,broadcast"], ["--study", "dispatch", "--collective", "all_reduce,all_gather"]],
)
def test_collectives_the_bench_cannot_time_are_refused(arguments: list[str]) -> None:
    from fairring.bench.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--loopback", *arguments])
