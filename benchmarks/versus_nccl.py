"""The GPU check's stage against NCCL where the network is the bottleneck, on the layouts clusters run.

Several processes on one GPU time-slice it unless MPS runs, and then every
spinning NCCL kernel waits out the other processes' slices: figures from that
compare schedulers, not all-reduces (docs/benchmarks.md, "On a GPU"). So this
stage starts MPS where the machine lets it (its control daemon, in folders of
its own, stopped when the stage ends), makes each machine a network namespace
whose NIC is shaped (the ranks of one machine in its namespace, NCCL on its
socket transport through that NIC, a distinct NCCL_HOSTID per process), and
runs `python -m fairring.bench --study compare` once per layout and link: the
all-reduce, FSDP's reduce-scatter and all-gather, each at every size the
engine, NCCL and a group under FAIRRING_CUDA_ENGINE=auto's routing on the same
tensors, the order rotated every iteration, every result checked exactly, with
the fraction of the hierarchical bound. The parts in order of value: 2 x 4 at
10 Gbit/s, 2 x 8 (16 processes) at 10, then both at 25, each where the time
left allows it. Before the first, NCCL's socket settings are tried at 64 MiB
and the fastest is kept for every part, so the figure is against NCCL as a
careful user runs it; after it, 8 buckets of 25 MiB issued at once (the
bench's overlap study), where the engine pays a fill and drain at each op and
NCCL pipelines.

What it is not: a cluster. The local steps run on one GPU without NVLink, and
the NICs are veths shaped by tc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairring._config import MPS_PIPE_DIRECTORY, SERIALIZED_LAUNCHES
from fairring._sizes import format_size

# The parts, in order of value: 8 ranks a machine is what clusters have; 2 x 4 first, since it fits where
# 2 x 8 may not. The CPU mode (CI's flow of the stage) keeps to 2 x 2 on 2 cores.
LINKS = {"cuda": ("10gbit", "25gbit"), "cpu": ("10gbit",)}
LAYOUTS = {"cuda": ((2, 4), (2, 8)), "cpu": ((2, 2), (2, 4))}
QUICK_LAYOUTS = {"cuda": ((2, 4),), "cpu": ((2, 2),)}
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
SIZES = {"cuda": "1MiB,4MiB,16MiB,64MiB,256MiB", "cpu": "256KiB,1MiB"}
QUICK_SIZES = {"cuda": "4MiB,64MiB", "cpu": "256KiB"}
# DDP's buckets back to back (8 issued at once, then waited for) on the first part's layout, where the
# engine pays a pipeline fill and drain at each op boundary and NCCL does not (docs/design.md, "What the
# op boundary costs").
BUCKETS = 8
BUCKET_SIZE = {"cuda": "25MiB", "cpu": "1MiB"}
# NCCL's socket transport at its defaults and at two settings NCCL's docs suggest for fast NICs, tried
# on the first part at TUNING_SIZE; the fastest is kept for every part.
NCCL_SOCKET_SETTINGS = (
    {},
    {"NCCL_SOCKET_NTHREADS": "2", "NCCL_NSOCKS_PERTHREAD": "2"},
    {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"},
)
TUNING_SIZE = "64MiB"
STAGE = "versus NCCL: 2 hosts x 4 and x 8 ranks, NICs shaped to 10 and 25 Gbit/s, MPS where it starts"
# On an H200 under MPS (2026-11-28), each 2x2 part at two sizes took 19 s, launch included; a 2 x 4 part
# of three collectives at five sizes, the buckets and the tuning need about this (not yet timed).
MINIMUM_S = 150.0
# Every rank's: NCCL's socket transport and nothing that would bypass the shaped NIC (the bench sets
# NCCL_SOCKET_IFNAME to the host's NIC); the engine kept under MPS, since the stage runs one group's
# collectives at a time (docs/design.md, "Serialized launches").
RANK_ENV = {"NCCL_IB_DISABLE": "1", "NCCL_NVLS_ENABLE": "0", "NCCL_MNNVL_ENABLE": "0", SERIALIZED_LAUNCHES: "engine"}
MPS_FOLDER = Path("/tmp/fairring-gpu-check-mps")
MPS_CONTROL = "nvidia-cuda-mps-control"
# A client that uses the GPU under MPS: whether MPS serves this machine's processes at all.
MPS_CLIENT = "import torch; torch.ones(1, device='cuda').add_(1); torch.cuda.synchronize(); print('ok')"


@dataclass
class Mps:
    """The MPS control daemon of the stage: what the probe found, and the ranks' variables to reach it."""

    state: str
    env: dict[str, str] = field(default_factory=dict)
    started: bool = False

    @property
    def running(self) -> bool:
        return bool(self.env)


def start_mps(device: str, timeout_s: float = 60.0) -> Mps:
    """Starts MPS's control daemon in folders of the stage's own, then checks that a client can use the
    GPU under it; stops it again where that fails. Never touches a daemon someone else runs."""
    if device != "cuda":
        return Mps("not tried (--device cpu)")
    control = shutil.which(MPS_CONTROL)
    if control is None:
        return Mps(f"not available: {MPS_CONTROL} is not on PATH")
    env = {MPS_PIPE_DIRECTORY: str(MPS_FOLDER / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(MPS_FOLDER / "log")}
    for folder in env.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    try:
        daemon = subprocess.run([control, "-d"], env={**os.environ, **env}, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        return Mps(f"not started: {error}")
    if daemon.returncode != 0:
        return Mps(f"not started: {MPS_CONTROL} -d exited {daemon.returncode}: {daemon.stderr.strip()[-300:]}")
    mps = Mps("started", env, started=True)
    deadline = time.monotonic() + 5
    while not (MPS_FOLDER / "pipe" / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        client = subprocess.run(
            [sys.executable, "-c", MPS_CLIENT], env={**os.environ, **env}, capture_output=True, text=True,
            timeout=timeout_s,
        )  # fmt: skip
        usable = client.returncode == 0 and client.stdout.strip().endswith("ok")
        why = f"exit {client.returncode}: {client.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        usable, why = False, f"a client did not finish within {timeout_s:.0f} s"
    if not usable:
        stop_mps(mps)
        return Mps(f"started, but a client could not use the GPU under it ({why}); run without MPS")
    mps.state = f"running ({MPS_FOLDER}), a client used the GPU under it"
    return mps


def stop_mps(mps: Mps) -> str:
    """Stops the daemon start_mps started (its servers end with it); what happened, for the report."""
    if not mps.started:
        return ""
    control = shutil.which(MPS_CONTROL) or MPS_CONTROL
    try:
        done = subprocess.run(
            [control], input="quit\n", env={**os.environ, **mps.env}, capture_output=True, text=True, timeout=30
        )
        outcome = "stopped" if done.returncode == 0 else f"quit exited {done.returncode}"
    except (OSError, subprocess.TimeoutExpired) as error:
        outcome = f"not stopped: {error}"
    mps.started = False
    mps.env = {}
    return outcome


def bench_arguments(
    machines: int, local: int, link: str, sizes: str, iters: int, settings: dict[str, str], collectives: str
) -> list[str]:
    """`python -m fairring.bench`'s arguments for one part of the stage: every collective listed, in one launch."""
    arguments = ["--hosts", str(machines), "--ranks-per-host", str(local), "--link", link, "--study", "compare"]
    arguments += ["--collective", collectives, "--sizes", sizes, "-n", str(iters), "-w", "1"]
    return arguments + rank_settings(settings)


def tuning_arguments(machines: int, local: int, link: str, settings: dict[str, str]) -> list[str]:
    """One NCCL socket setting's try: the engine and NCCL's all-reduce at TUNING_SIZE, 2 timed after 1."""
    arguments = ["--hosts", str(machines), "--ranks-per-host", str(local), "--link", link, "--study", "single"]
    arguments += ["--sizes", TUNING_SIZE, "-n", "2", "-w", "1"]
    return arguments + rank_settings(settings)


def overlap_arguments(
    device: str, machines: int, local: int, link: str, iters: int, settings: dict[str, str]
) -> list[str]:
    """The buckets back to back: the bench's overlap study at 4 slices in flight."""
    arguments = ["--hosts", str(machines), "--ranks-per-host", str(local), "--link", link, "--study", "overlap"]
    arguments += ["--buckets", str(BUCKETS), "--bucket-size", BUCKET_SIZE[device], "--inflight", "4"]
    arguments += ["-n", str(iters), "-w", "1"]
    return arguments + rank_settings(settings)


def setting_text(setting: dict[str, str]) -> str:
    return " ".join(f"{name}={value}" for name, value in setting.items()) or "NCCL's defaults"


def rank_settings(settings: dict[str, str]) -> list[str]:
    """--set for every rank: RANK_ENV, then `settings` (MPS's variables, NCCL's socket setting)."""
    arguments = []
    for name, value in {**RANK_ENV, **settings}.items():
        arguments += ["--set", f"{name}={value}"]
    return arguments


def summarize(records: list[dict[str, Any]], machines: int, local: int) -> dict[str, Any]:
    """One collective's rows by size and backend; from which size the engine is at least as fast as the
    baseline at every larger size measured, and where auto put the engine."""
    keys = ("backend", "bytes", "median_s", "busbw_GBps", "speedup_vs_baseline", "fraction_of_bound_speed", "correct")
    rows = [{key: record.get(key) for key in keys} for record in records]
    engine = {r["bytes"]: r for r in records if r["backend"] == "fairring"}
    sizes = sorted(engine)
    wins_from = None
    for index, size in enumerate(sizes):
        if all(engine[later]["speedup_vs_baseline"] >= 1.0 for later in sizes[index:]):
            wins_from = size
            break
    auto = next((r for r in records if "auto_threshold" in r), None)
    return {
        "layout": f"{machines}x{local}",
        "baseline": records[0]["baseline"] if records else None,
        "rows": rows,
        "engine_at_least_as_fast_from": wins_from,
        "auto": None
        if auto is None
        else {key: auto[key] for key in ("auto_threshold", "auto_ceiling", "auto_reason", "auto_measure_s")},
    }


def lines(summary: dict[str, Any], table: Any, percent: Any) -> list[str]:
    """The report's section: what ran, a table per part and collective, and what it says for the default."""
    parts = summary.get("parts", {})
    head = [
        f"MPS: {summary.get('mps', 'not probed')}. Network namespaces: {summary.get('netns', 'not probed')}.",
        "",
        "float32, each machine a network namespace whose NIC is shaped as the part says, the engine",
        "(fairring), the baseline and FAIRRING_CUDA_ENGINE=auto's routing (fairring-auto) on the same tensors,",
        "the order rotated every iteration, every result checked; median of the slowest rank's times; a",
        "reduce-scatter's or all-gather's size is its N-chunk tensor's.",
        "The baseline is NCCL on its socket transport through that NIC (a distinct NCCL_HOSTID per process);",
        "one GPU shared by every process (MPS as above), no NVLink, NICs emulated by tc: not a cluster."
        if summary.get("device") == "cuda"
        else "CPU tensors (the check's CPU mode): the baseline is Gloo, and no GPU is involved.",
    ]
    tuning = summary.get("nccl_tuning")
    if tuning:
        tried = "; ".join(f"{t['setting']}: {t['nccl_ms']:.1f} ms" for t in tuning.get("tried", []))
        head += [
            "",
            f"NCCL's socket settings: {tuning['kept']}"
            + (f" (its all-reduce at {TUNING_SIZE}: {tried})" if tried else ""),
        ]
    if not parts:
        return [*head, "", "Not run."]

    def cells(row: dict[str, Any]) -> list[str]:
        """A row's backend, time, speed against the baseline, fraction of the bound and check."""
        return [
            row["backend"],
            f"{row['median_s'] * 1e3:.1f}",
            f"{row['speedup_vs_baseline']:.2f}x",
            percent(row.get("fraction_of_bound_speed")),
            "yes" if row["correct"] else "NO",
        ]

    def collective_lines(title: str, part: dict[str, Any]) -> list[str]:
        body = [[format_size(int(row["bytes"])), *cells(row), f"{row['busbw_GBps']:.3f}"] for row in part["rows"]]
        found = ["", title, ""]
        found += table(["size", "backend", "ms", "vs baseline", "of bound", "correct", "busbw GB/s"], body)
        wins = part["engine_at_least_as_fast_from"]
        auto = part.get("auto") or {}
        return [
            *found,
            "",
            "The engine is at least as fast as the baseline "
            + (f"from {format_size(wins)} up." if wins else "at no size from which it stays so.")
            + (f" auto chose: {auto['auto_reason']}" if auto else ""),
        ]

    out = head
    for name, part in parts.items():
        for collective, found in part["collectives"].items():
            out += collective_lines(f"{collective}, {name} (machines x ranks, NIC rate):", found)
    overlap = summary.get("overlap")
    if overlap:
        out += ["", f"{overlap['what']}, {overlap['part']}:", ""]
        header = ["backend", "ms for all", "vs baseline", "of bound", "correct"]
        out += table(header, [cells(row) for row in overlap["rows"]])
    out += ["", default_reading(parts)]
    for left_out in summary.get("left_out", []):
        out += ["", left_out]
    return out


def default_reading(parts: dict[str, Any]) -> str:
    """What the parts say for the default threshold (issue 63): the smallest size from which the engine is at
    least as fast as the baseline at every larger size of every part and collective, or where it never is."""
    wins_from = {
        f"{collective} on {name}": found["engine_at_least_as_fast_from"]
        for name, part in parts.items()
        for collective, found in part["collectives"].items()
    }
    never = [where for where, size in wins_from.items() if size is None]
    if never:
        return (
            "For the default threshold: the engine is slower than the baseline at the largest size measured in "
            + ", ".join(never)
            + "; no threshold makes it no slower everywhere measured."
        )
    largest = max(wins_from.values())
    return (
        f"For the default threshold: from {format_size(largest)} (inclusive) the engine is at least as fast as "
        "the baseline at every size measured of every part and collective above."
    )
