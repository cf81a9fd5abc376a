"""Versus NCCL: the engine, NCCL (Gloo) and auto's routing on hosts with shaped NICs (benchmarks/versus_nccl.py)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from benchmarks import gpu_tools, versus_nccl
from fairring._sizes import format_size
from fairring.bench.netns import netns_available

from .processes import run_fairring_bench
from .stage import Stage, conclude, tail

# What the stage reports as each part ends (the check's report, rewritten with it so far).
Progress = Callable[[Stage, dict[str, Any]], None]
# A part's time grows with its processes, which share one GPU; the next part is tried only where this
# much more than that estimate is left.
MARGIN = 1.2
# Less than this left is not worth a launch: the ranks' start alone takes about as long.
MINIMUM_PART_S = 20.0


def why_no_netns() -> str:
    available, reason = netns_available()
    if available:
        return ""
    if "is not installed" in reason:  # the GPU machine's image has no iproute2 and no network
        reason += f"; run `make gpu-tools` where the network is and carry {gpu_tools.FOLDER.name}"
    return f"skipped: {reason}"


def run_versus(
    args: argparse.Namespace, timeout: float, progress: Progress | None = None
) -> tuple[Stage, dict[str, Any]]:
    """The engine, NCCL (Gloo) and auto's routing on hosts whose NICs are shaped, MPS where it starts
    (benchmarks/versus_nccl.py): each part (layout and NIC rate) where the time left allows it."""
    stage = Stage(versus_nccl.STAGE)
    available, reason = netns_available()
    summary: dict[str, Any] = {
        "device": args.device,
        "netns": "available" if available else f"unavailable: {reason}",
        "parts": {},
        "left_out": [],
    }
    problems: list[str] = []
    started = time.monotonic()
    mps = versus_nccl.start_mps(args.device)
    summary["mps"] = mps.state
    print(f"gpu-check: MPS: {mps.state}", flush=True)
    layouts = (versus_nccl.QUICK_LAYOUTS if args.quick else versus_nccl.LAYOUTS)[args.device]
    sizes = (versus_nccl.QUICK_SIZES if args.quick else versus_nccl.SIZES)[args.device]
    collectives = ",".join(versus_nccl.COLLECTIVES)
    expected = 3 * len(sizes.split(",")) * len(versus_nccl.COLLECTIVES)
    seconds_per_process: float | None = None
    try:
        settings = dict(mps.env)
        for link in versus_nccl.LINKS[args.device]:
            for machines, local in layouts:
                name = f"{machines}x{local} at {link}"
                left = timeout - (time.monotonic() - started)
                needed = (
                    MINIMUM_PART_S if seconds_per_process is None else MARGIN * seconds_per_process * machines * local
                )
                if left < needed:
                    summary["left_out"].append(f"{name} left out: {left:.0f} s of the stage left")
                    continue
                if seconds_per_process is None and args.device == "cuda" and not args.quick:
                    settings.update(tune_nccl(stage, machines, local, link, settings, left, summary, problems))
                    left = timeout - (time.monotonic() - started)
                arguments = versus_nccl.bench_arguments(
                    machines, local, link, sizes, args.compare_iters, settings, collectives
                )
                records, found, seconds = run_versus_part(stage, arguments, left, name, expected)
                problems += found
                summary["parts"][name] = {
                    "layout": f"{machines}x{local}",
                    "link": link,
                    "collectives": {
                        collective: versus_nccl.summarize(
                            [r for r in records if r.get("collective") == collective], machines, local
                        )
                        for collective in versus_nccl.COLLECTIVES
                    },
                }
                if seconds_per_process is None:
                    seconds_per_process = seconds / (machines * local)
                    problems += run_buckets(stage, args, machines, local, link, settings, timeout, started, summary)
                if progress is not None:
                    progress(stage, summary)
    finally:
        stopped = versus_nccl.stop_mps(mps)
        if stopped:
            summary["mps"] += f"; {stopped} after the stage"
    stage.seconds = time.monotonic() - started
    stage.output_tail = tail(stage.output_tail)
    return conclude(stage, {**summary, "problems": []}, problems, "every result correct")


def tune_nccl(
    stage: Stage,
    machines: int,
    local: int,
    link: str,
    settings: dict[str, str],
    left: float,
    summary: dict[str, Any],
    problems: list[str],
) -> dict[str, str]:
    """Each of NCCL's socket settings on the first part at versus_nccl.TUNING_SIZE, in at most a third of
    `left`: the fastest NCCL all-reduce's setting, kept for every part, and what was tried, in the summary."""
    tried: list[dict[str, Any]] = []
    deadline = time.monotonic() + left / 3
    for setting in versus_nccl.NCCL_SOCKET_SETTINGS:
        budget = deadline - time.monotonic()
        if budget < MINIMUM_PART_S:
            break
        arguments = versus_nccl.tuning_arguments(machines, local, link, {**settings, **setting})
        text = versus_nccl.setting_text(setting)
        records, found, _ = run_versus_part(stage, arguments, budget, f"NCCL tuning, {text}", 2)
        problems += found
        nccl = [r for r in records if r["backend"] == "nccl" and r["correct"]]
        if nccl:
            tried.append({"setting": text, "nccl_ms": nccl[0]["median_s"] * 1e3, "env": setting})
    best = min(tried, key=lambda t: t["nccl_ms"], default=None)
    kept = "not tuned: no setting finished in the time" if best is None else best["setting"]
    summary["nccl_tuning"] = {"tried": [{k: t[k] for k in ("setting", "nccl_ms")} for t in tried], "kept": kept}
    return {} if best is None else best["env"]


def run_buckets(
    stage: Stage,
    args: argparse.Namespace,
    machines: int,
    local: int,
    link: str,
    settings: dict[str, str],
    timeout: float,
    started: float,
    summary: dict[str, Any],
) -> list[str]:
    """DDP's buckets back to back on the first part: the engine against the baseline."""
    arguments = versus_nccl.overlap_arguments(args.device, machines, local, link, args.compare_iters, settings)
    left = timeout - (time.monotonic() - started)
    if left < MINIMUM_PART_S:
        summary["left_out"].append(f"the buckets left out: {left:.0f} s of the stage left")
        return []
    records, found, _ = run_versus_part(stage, arguments, left, "buckets", 2)
    keys = ("backend", "median_s", "speedup_vs_baseline", "fraction_of_bound_speed", "correct")
    summary["overlap"] = {
        "what": f"{versus_nccl.BUCKETS} all-reduces of {versus_nccl.BUCKET_SIZE[args.device]} issued at once",
        "part": f"{machines}x{local} at {link}",
        "rows": [{key: r.get(key) for key in keys} for r in records],
    }
    return found


def run_versus_part(
    stage: Stage, arguments: list[str], timeout: float, label: str, expected: int
) -> tuple[list[dict[str, Any]], list[str], float]:
    """One bench run of the versus stage, its commands and output added to the stage's: its records,
    what went wrong (labelled), and its seconds."""
    part = Stage(stage.name)
    records, found = run_fairring_bench(part, arguments, timeout)
    stage.commands += part.commands
    stage.output_tail += part.output_tail
    problems = [f"{label}: {problem}" for problem in found]
    problems += [
        f"{label}: {r['backend']} {r.get('collective', 'all_reduce')} at {format_size(int(r['bytes']))} was wrong"
        for r in records
        if not r["correct"]
    ]
    if len(records) != expected:
        problems.append(f"{label}: {len(records)} records of {expected}")
    return records, problems, part.seconds
