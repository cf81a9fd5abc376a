"""The NIXL stage: the bench's two processes on the NIXL rails, where NIXL loads."""

from __future__ import annotations

import argparse
from typing import Any

from fairring._config import RAILS_TRANSPORT, ConfigError
from fairring._nixl import nixl_library
from fairring._sizes import parse_size

from .ranks import BENCH_WORLD, bench_phases, run_ranks, summarize
from .stage import Stage, conclude

NIXL_STAGE = f"nixl: {BENCH_WORLD} processes as {BENCH_WORLD} machines on the NIXL rails"
NIXL_SIZES = {"cuda": "16MiB,64MiB", "cpu": "1MiB"}


def run_nixl(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    """The engine over the NIXL rails (GPU staging registered with UCX where --device cuda)."""
    stage = Stage(NIXL_STAGE)
    sizes = [parse_size("--sizes", text) for text in NIXL_SIZES[args.device].split(",")]
    phases = bench_phases(args, sizes)
    ranks, problems = run_ranks(args, stage, BENCH_WORLD, phases, {RAILS_TRANSPORT: "nixl"}, timeout)
    return conclude(stage, summarize(ranks, args, sizes), problems, "all results correct")


def why_no_nixl() -> str:
    """Why the NIXL stage cannot run here; "" where it can."""
    try:
        nixl_library()
    except ConfigError as error:
        return f"skipped: {error}"
    return ""
