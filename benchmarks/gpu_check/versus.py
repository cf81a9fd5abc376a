"""Versus NCCL: the engine, NCCL (Gloo) and auto's routing on hosts with shaped NICs (benchmarks/versus_nccl.py)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks import gpu_tools, versus_nccl
from fairring._sizes import format_size
from fairring.bench.netns import netns_available

from .processes import run_fairring_bench
from .stage import Stage, conclude, tail, time_left_for


def why_no_netns() -> str:
    available, reason = netns_available()
    if available:
        return ""
    if "is not installed" in reason:  # the GPU machine's image has no iproute2 and no network
        reason += f"; run `make gpu-tools` where the network is and carry {gpu_tools.FOLDER.name}"
    return f"skipped: {reason}"


def run_versus(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    """The engine, NCCL (Gloo) and auto's routing on hosts whose NICs are shaped, MPS where it starts
    (benchmarks/versus_nccl.py): 2x2, then 2x4 where the time allows (not with --quick)."""
    stage = Stage(versus_nccl.STAGE)
    available, reason = netns_available()
    summary: dict[str, Any] = {
        "device": args.device,
        "netns": "available" if available else f"unavailable: {reason}",
        "layouts": {},
    }
    problems: list[str] = []
    started = time.monotonic()
    mps = versus_nccl.start_mps(args.device)
    summary["mps"] = mps.state
    print(f"gpu-check: MPS: {mps.state}", flush=True)
    try:
        first_s = None
        for machines, local in versus_nccl.LAYOUTS[: 1 if args.quick else None]:
            layout = f"{machines}x{local}"
            left = time_left_for(layout, timeout, started, first_s, summary)
            if not left:
                break
            sizes = (versus_nccl.QUICK_SIZES if args.quick else versus_nccl.SIZES)[args.device]
            arguments = versus_nccl.bench_arguments(machines, local, sizes, args.compare_iters, mps)
            records, found, seconds = run_versus_part(stage, arguments, left, layout, 3 * len(sizes.split(",")))
            first_s = first_s or seconds
            problems += found
            summary["layouts"][layout] = versus_nccl.summarize(records, machines, local)
            if layout == "2x2":
                # DDP's buckets back to back: the engine against the baseline.
                arguments = versus_nccl.overlap_arguments(args.device, args.compare_iters, mps)
                left = timeout - (time.monotonic() - started)
                records, found, _ = run_versus_part(stage, arguments, left, "buckets", 2)
                problems += found
                keys = ("backend", "median_s", "speedup_vs_baseline", "fraction_of_bound_speed", "correct")
                what = f"{versus_nccl.BUCKETS} all-reduces of {versus_nccl.BUCKET_SIZE[args.device]} issued at once"
                summary["overlap"] = {"what": what, "rows": [{key: r.get(key) for key in keys} for r in records]}
                # FSDP's collectives, each about half an all-reduce's time, where the stage has it (--quick: the
                # reduce-scatter only, the all-gather being the same path on the same processes).
                for collective in ("reduce_scatter",) if args.quick else ("reduce_scatter", "all_gather"):
                    left = timeout - (time.monotonic() - started)
                    if left < first_s:
                        summary.setdefault("left_out", f"{collective} left out: {left:.0f} s of the stage left")
                        continue
                    arguments = versus_nccl.bench_arguments(machines, local, sizes, args.compare_iters, mps, collective)
                    expected = 3 * len(sizes.split(","))
                    records, found, _ = run_versus_part(stage, arguments, left, collective, expected)
                    problems += found
                    summary.setdefault("fsdp", {})[collective] = versus_nccl.summarize(records, machines, local)
    finally:
        stopped = versus_nccl.stop_mps(mps)
        if stopped:
            summary["mps"] += f"; {stopped} after the stage"
    stage.seconds = time.monotonic() - started
    stage.output_tail = tail(stage.output_tail)
    return conclude(stage, {**summary, "problems": []}, problems, "every result correct")


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
        f"{label}: {r['backend']} at {format_size(int(r['bytes']))} gave wrong results"
        for r in records
        if not r["correct"]
    ]
    if len(records) != expected:
        problems.append(f"{label}: {len(records)} records of {expected}")
    return records, problems, part.seconds
