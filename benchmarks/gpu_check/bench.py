"""The bench stage: engine all-reduce throughput against the bare rails, then every dtype and op checked."""

from __future__ import annotations

import argparse
from typing import Any

from .ranks import BENCH_WORLD, bench_phases, run_ranks, summarize
from .stage import Stage, conclude

BENCH_STAGE = f"bench: {BENCH_WORLD} processes as {BENCH_WORLD} machines"


def run_bench(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    stage = Stage(BENCH_STAGE)
    phases = bench_phases(args, args.size_list)
    ranks, problems = run_ranks(args, stage, BENCH_WORLD, phases, {}, timeout)
    return conclude(stage, summarize(ranks, args, args.size_list), problems, "all results correct")
