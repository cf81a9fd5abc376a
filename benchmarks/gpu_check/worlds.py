"""The correctness stages: every dtype and op on the layouts of --worlds, local steps on real NCCL groups."""

from __future__ import annotations

import argparse
from typing import Any

from fairring._config import (
    DEFAULT_CPU_FLAT_THRESHOLD,
    FLAT_THRESHOLD,
    SERIALIZED_LAUNCHES,
)

from .cli import parse_layout
from .ranks import check_phases, run_ranks, summarize
from .stage import Stage, conclude

# Among the correctness cases' sizes (1 to 1000003 elements): the small ones to NCCL, the large to the engine.
MIXED_THRESHOLD = 1 << 20


def world_stage(spec: str, nccl_job: bool = False) -> str:
    """The stage's name, the same whether it runs or is skipped (`nccl_job`: as_an_nccl_job's answer)."""
    machines, local = parse_layout(spec)
    if local == 1:
        return f"correctness: {machines} processes as {machines} machines"
    as_nccl = ", as an NCCL job starts (pg_options, device_id)" if nccl_job else ""
    return f"correctness: {machines * local} processes as {machines} machines x {local} ranks{as_nccl}"


def as_users_run(args: argparse.Namespace, spec: str) -> dict[str, str]:
    """The first layout with local steps runs as a Megatron-style job would: the GPU in launch order
    (CUDA_DEVICE_MAX_CONNECTIONS=1) and a flat threshold among the cases' sizes (CUDA's default, 16 MiB,
    is above them all), so that NCCL's own all-reduces of the small cases are launched among the
    engine's; the others run the engine at every size.
    The engine is kept there (FAIRRING_SERIALIZED_LAUNCHES=engine): the check runs one group's
    collectives at a time, which is what that setting vouches for."""
    first = next((other for other in args.world_list if parse_layout(other)[1] > 1), None)
    if spec != first:
        return {}
    threshold = MIXED_THRESHOLD if args.device == "cuda" else DEFAULT_CPU_FLAT_THRESHOLD
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1", SERIALIZED_LAUNCHES: "engine", FLAT_THRESHOLD: str(threshold)}


def as_an_nccl_job(args: argparse.Namespace, spec: str) -> bool:
    """The second layout with local steps starts as a job set up for NCCL does (cuda_bench's
    --as-nccl-job: ProcessGroupNCCL.Options as pg_options, device_id), so those reach real NCCL
    groups; the first keeps fairring's defaults."""
    local_layouts = [other for other in args.world_list if parse_layout(other)[1] > 1]
    return len(local_layouts) > 1 and spec == local_layouts[1]


def world_stage_of(args: argparse.Namespace, spec: str) -> str:
    """The name of layout `spec`'s stage in this check: its step's, its stage's and its summary's key."""
    return world_stage(spec, as_an_nccl_job(args, spec))


def run_world(args: argparse.Namespace, spec: str, timeout: float) -> tuple[Stage, dict[str, Any]]:
    nccl_job = as_an_nccl_job(args, spec)
    stage = Stage(world_stage_of(args, spec))
    machines, local = parse_layout(spec)
    extra = as_users_run(args, spec)
    phases = check_phases(args) + (["--as-nccl-job"] if nccl_job else [])
    ranks, problems = run_ranks(args, stage, machines * local, phases, extra, timeout, local)
    summary = summarize(ranks, args, [])
    return conclude(stage, summary, problems, f"all {summary['correctness']['planned_per_rank']} cases correct")
