"""The compare stages: fairring's engine, NCCL's all-reduce and Gloo's in the same processes, side by side."""

from __future__ import annotations

import argparse
from typing import Any

from fairring._sizes import format_size

from .cli import parse_layout
from .ranks import rank_problems, run_ranks
from .stage import Stage, conclude


def compare_stage(spec: str) -> str:
    machines, local = parse_layout(spec)
    return f"compare: fairring, NCCL, Gloo on {machines} machines x {local} ranks"


def run_compare(args: argparse.Namespace, spec: str, timeout: float) -> tuple[Stage, dict[str, Any]]:
    stage = Stage(compare_stage(spec))
    machines, local = parse_layout(spec)
    phases = [
        "--compare-sizes", ",".join(str(size) for size in args.compare_size_list), "--compare-gloo",
        "--iters", str(args.compare_iters), "--warmup", "1",
    ]  # fmt: skip
    nccl_info = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    ranks, problems = run_ranks(args, stage, machines * local, phases, nccl_info, timeout, local)
    summary = summarize_compare(ranks, args, spec)
    summary["nccl_info"] = (ranks.get(0) or {}).get("nccl_info", [])
    if args.device == "cuda" and not any("Using network" in line for line in summary["nccl_info"]):
        problems.append("NCCL said nothing of its network: its INFO lines are missing")
    return conclude(stage, summary, problems, "every result correct")


def summarize_compare(ranks: dict[int, dict[str, Any] | None], args: argparse.Namespace, spec: str) -> dict[str, Any]:
    """Rank 0's rows (each the slower rank's median): time, busbw, and the engine against the others."""
    problems: list[str] = []
    machines, local = parse_layout(spec)
    world = machines * local
    for rank, result in ranks.items():
        problems += rank_problems(rank, result)
    compare = (ranks.get(0) or {}).get("compare", {})
    contenders, rows = compare.get("contenders", []), compare.get("rows", [])
    for row in rows:
        for name in contenders:
            if not row[name]["correct"]:
                problems.append(f"{name} at {format_size(row['bytes'])} gave wrong results")
            row[name]["busbw_GBps"] = row["bytes"] / row[name]["median_s"] / 1e9 * 2 * (world - 1) / world
        for name in contenders[1:]:
            row[f"fairring_vs_{name}"] = row[name]["median_s"] / row["fairring"]["median_s"]
    if len(rows) != len(args.compare_size_list):
        problems.append(f"compared at {len(rows)} of {len(args.compare_size_list)} sizes")
    return {"layout": spec, "contenders": contenders, "rows": rows, "problems": problems}
