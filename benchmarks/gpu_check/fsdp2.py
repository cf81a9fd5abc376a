"""The FSDP2 stage: a GPT of 124M parameters trained by FSDP2 on hosts with shaped NICs, the engine against
NCCL (issue 62: step time, losses, and how long the host is busy issuing each step), then on 2 x 4 by DDP
with its 25 MiB buckets too (issue 63's training figure)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks import versus_nccl
from fairring.bench.netns import netns_available

from .processes import run_fairring_bench
from .stage import Stage, conclude, time_left_for

LINK = "10gbit"
# Issue 62's layouts for FSDP2: 2 x 2, then 2 x 4 where the time allows, there with DDP too (DDP's default
# 25 MiB buckets, which the CUDA flat threshold of 16 MiB gives the engine): (layout, parallelisms).
LAYOUTS = (((2, 2), ("fsdp2",)), ((2, 4), ("fsdp2", "ddp")))
FSDP2_STAGE = f"fsdp2: GPT-124M by FSDP2 (2 x 2, 2 x 4) and DDP (2 x 4), NICs at {LINK}, MPS where it starts"
# On the CPU (the check's own test) the tiny transformer: the flow, not the figures.
MODEL = {"cuda": "gpt-124m", "cpu": "gpt-tiny"}
# Timed steps after 2 of warmup, each backend: enough for a median on a GPU shared under MPS.
STEPS = {"cuda": 6, "cpu": 2}
# bf16 autocast: the training study's own tolerance for its losses.
LOSS_TOLERANCE = 1e-2


def fsdp2_arguments(
    device: str, layout: str, parallelisms: tuple[str, ...], mps: versus_nccl.Mps, shaped: bool
) -> list[str]:
    """`python -m fairring.bench`'s arguments for one layout: the training study's real part, as parallelised."""
    parallelism = parallelisms[0] if len(parallelisms) == 1 else "both"
    arguments = ["--study", "training", "--part", "real", "--parallelism", parallelism, "--real-models", MODEL[device]]
    arguments += ["--real-layouts", layout, "--real-steps", str(STEPS[device])]
    arguments += ["--link", LINK, "--hosts-only"] if shaped else ["--loopback"]
    arguments += ["--cuda"] if device == "cuda" else []
    return arguments + versus_nccl.rank_settings(mps.env)


def run_fsdp2(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    """2x2, then 2x4 where the time allows (not with --quick); every run's fairring record against its
    baseline's: losses within the study's tolerance, and the engine used."""
    stage = Stage(FSDP2_STAGE)
    shaped, reason = netns_available()
    summary: dict[str, Any] = {
        "model": MODEL[args.device],
        "netns": "available" if shaped else f"unavailable ({reason}): loopback",
        "rows": [],
        "problems": [],
    }
    problems: list[str] = []
    started = time.monotonic()
    mps = versus_nccl.start_mps(args.device)
    summary["mps"] = mps.state
    try:
        first_s = None
        for (machines, local), parallelisms in LAYOUTS[: 1 if args.quick else None]:
            layout = f"{machines}x{local}"
            left = time_left_for(layout, timeout, started, first_s, summary, runs=len(parallelisms))
            if not left:
                break
            part = Stage(stage.name)
            arguments = fsdp2_arguments(args.device, layout, parallelisms, mps, shaped)
            records, found = run_fairring_bench(part, arguments, left)
            stage.commands += part.commands
            stage.output_tail = part.output_tail
            first_s = first_s or part.seconds
            problems += [f"{layout}: {problem}" for problem in found]
            for parallel in parallelisms:
                mine = [record for record in records if record.get("parallel") == parallel]
                problems += [f"{layout} {parallel}: {problem}" for problem in check(mine)]
            summary["rows"] += [row(record, layout) for record in records]
    finally:
        summary["mps_stopped"] = versus_nccl.stop_mps(mps)
    stage.seconds = time.monotonic() - started
    return conclude(stage, summary, problems, "the losses agree with the baseline's on every run")


def check(records: list[dict[str, Any]]) -> list[str]:
    """What is wrong with one layout's records: fairring's and the baseline's, fairring's losses close to
    the baseline's, and some of its collectives on the engine."""
    ours = [record for record in records if record["backend"] == "fairring"]
    if len(ours) != 1 or len(records) != 2:
        return [f"{len(records)} records, {len(ours)} of them fairring's (expected 2 and 1)"]
    problems = []
    gap = ours[0].get("loss_gap")
    if gap is None or gap >= LOSS_TOLERANCE:
        problems.append(f"loss gap {gap} against {ours[0].get('baseline')}")
    if not ours[0].get("engine_all_reduces"):
        problems.append("no collective went to the engine")
    return problems


def row(record: dict[str, Any], layout: str) -> dict[str, Any]:
    keys = ("parallel", "backend", "median_s", "issue_s", "speedup_vs_baseline", "loss_gap")
    return {"layout": layout, **{key: record.get(key) for key in keys}}


def fsdp2_lines(summary: dict[str, Any], table: Any) -> list[str]:
    """The stage's table for the report: step and issue time per layout and backend."""
    rows = summary.get("rows", [])
    if not rows:
        return ["Not run."]
    lines = [
        f"Model {summary['model']}, FSDP2's fully_shard per block or DDP's 25 MiB buckets, bf16 autocast. "
        f"MPS: {summary.get('mps')}. "
        f"Network namespaces: {summary.get('netns')}. 'issued s': how long the host took to issue a step, "
        "waits in collectives included (the rest of the step it was free); one GPU shared by every process, "
        "not a cluster.",
        "",
    ]

    def cell(value: Any, form: str) -> str:
        return format(value, form) if isinstance(value, (int, float)) else "-"

    body = [
        [
            item["layout"],
            item.get("parallel") or "fsdp2",
            item["backend"],
            cell(item.get("median_s"), ".3f"),
            cell(item.get("issue_s"), ".3f"),
            f"{item['speedup_vs_baseline']:.2f}x" if item.get("speedup_vs_baseline") else "",
            cell(item.get("loss_gap"), ".1e"),
        ]
        for item in rows
    ]
    lines += table(["layout", "parallel", "backend", "step s", "issued s", "vs baseline", "loss gap"], body)
    return lines + ([summary["left_out"]] if summary.get("left_out") else [])
