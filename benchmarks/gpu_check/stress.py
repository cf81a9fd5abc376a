"""The stress stage: large slices and TensorPipe's cuda_basic, many all-reduces in flight, each checked."""

from __future__ import annotations

import argparse
import os
from typing import Any

from fairring import _C
from fairring._config import CHANNELS, SLICE_SIZE, TOTAL_MEMORY, load_config
from fairring._sizes import format_size

from .ranks import BENCH_WORLD, rank_problems, rank_settings, run_ranks
from .stage import Stage, conclude

STRESS_STAGE = "stress: cuda_basic, large slices"
# FAIRRING_TOTAL_MEMORY for the stress, in slices: the plan stages in half of it, and a slice on
# two machines stages twice its bytes, so 16 hold FAIRRING_SLICES_IN_FLIGHT's default of 4.
STRESS_MEMORY_SLICES = 16


def stress_plan(args: argparse.Namespace, settings: dict[str, str]) -> dict[str, Any]:
    """The engine's plan of one stress all-reduce on two machines of one rank (as fairring._plan_log.plan_of)."""
    config = load_config({**os.environ, **settings})
    return _C.plan_shape(
        numel=args.stress_bytes // 4,
        element_size=4,
        local_size=1,
        machines=BENCH_WORLD,
        transport_min_shard_bytes=_C.CUDA_MIN_SHARD_BYTES if args.device == "cuda" else 1,
        max_slice_bytes=config.slice_size,
        min_shard_bytes=config.min_shard,
        total_memory_bytes=config.total_memory,
        max_slices_in_flight=config.slices_in_flight,
    )


def run_stress(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    stage = Stage(STRESS_STAGE)
    extra = {
        SLICE_SIZE: format_size(args.stress_slice),
        TOTAL_MEMORY: format_size(args.stress_slice * STRESS_MEMORY_SLICES),
        # Requires cuda_basic for CUDA buffers (and leaves out cuda_gdr); CPU buffers keep basic.
        CHANNELS: "cuda_basic",
    }
    phases = [
        "--stress-ops", str(args.stress_ops), "--stress-bytes", str(args.stress_bytes),
        "--stress-rounds", str(args.stress_rounds),
    ]  # fmt: skip
    ranks, problems = run_ranks(args, stage, BENCH_WORLD, phases, extra, timeout)
    summary = summarize_stress(ranks, args)
    summary["settings"] = extra
    summary["plan"] = stress_plan(args, rank_settings(args, BENCH_WORLD, 0, 0, extra))
    planned = args.stress_ops * args.stress_rounds
    return conclude(stage, summary, problems, f"all {planned} all-reduces correct on every rank")


def summarize_stress(ranks: dict[int, dict[str, Any] | None], args: argparse.Namespace) -> dict[str, Any]:
    """Every rank's checks; per round, the slower rank's time."""
    problems: list[str] = []
    planned = args.stress_ops * args.stress_rounds
    failed: list[dict[str, Any]] = []
    seconds: dict[int, float] = {}
    for rank, result in ranks.items():
        problems += rank_problems(rank, result)
        stress = (result or {}).get("stress", {})
        cases = stress.get("cases", [])
        failed += [{"rank": rank, **case} for case in cases if not case.get("ok")]
        if result is not None and len(cases) != planned:
            problems.append(f"rank {rank} checked {len(cases)} of {planned} all-reduces")
        for row in stress.get("rounds", []):
            seconds[row["round"]] = max(seconds.get(row["round"], 0.0), row["seconds"])
    if failed:
        problems.append(f"{len(failed)} all-reduce(s) gave wrong results")
    rails = (ranks.get(0) or {}).get("engine_rails")
    if args.device == "cuda" and rails is not None and "cuda_basic" not in rails:
        problems.append(f"the engine's rails do not name cuda_basic: {rails}")
    return {
        "ops": args.stress_ops,
        "bytes": args.stress_bytes,
        "rounds": args.stress_rounds,
        "round_seconds": [seconds[index] for index in sorted(seconds)],
        "failed": failed[:50],
        "engine_stats": {rank: (result or {}).get("engine_stats") for rank, result in ranks.items()},
        "engine_rails": rails,
        "problems": problems,
    }
