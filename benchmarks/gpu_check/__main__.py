"""`python -m benchmarks.gpu_check`: the stages in order of value, each in its share of --budget (budget.py)."""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from typing import Any

import torch

from benchmarks import gpu_tools, versus_nccl

from .bench import BENCH_STAGE, run_bench
from .budget import (
    BENCH_MINIMUM_S,
    COMPARE_MINIMUM_S,
    CONTRACT_MINIMUM_S,
    FAILURE_MINIMUM_S,
    FSDP2_MINIMUM_S,
    NIXL_MINIMUM_S,
    STRESS_MINIMUM_S,
    TESTS_MINIMUM_S,
    TRAINING_MINIMUM_S,
    VALIDATE_MINIMUM_S,
    WORLD_LIMIT_PER_PROCESS_S,
    WORLD_MINIMUM_PER_PROCESS_S,
    Step,
    run_steps,
)
from .cli import parse_args, parse_layout
from .compare import compare_stage, run_compare
from .cuda_tests import CONTRACT_STAGE, TESTS_STAGE, run_tests
from .environment import build_stage, environment, gpu_names
from .failure import FAILURE_STAGE, run_failure
from .fsdp2 import FSDP2_STAGE, run_fsdp2
from .nixl import NIXL_STAGE, run_nixl, why_no_nixl
from .report import write_report
from .stage import Stage
from .stress import STRESS_STAGE, run_stress
from .training import TRAINING_STAGE, run_training
from .validate import VALIDATE_STAGE, run_validate
from .versus import run_versus, why_no_netns
from .worlds import run_world, world_stage_of


def steps(args: argparse.Namespace) -> list[Step]:
    """The stages in order."""
    tests_skip = ""
    if args.tests == "skip":
        tests_skip = "skipped (--tests skip)"
    elif args.tests == "auto" and args.device == "cpu":
        tests_skip = "skipped (--device cpu)"

    def world_step(spec: str) -> Step:
        machines, local = parse_layout(spec)
        limit = args.worlds_timeout or WORLD_LIMIT_PER_PROCESS_S * machines * local
        reserve = WORLD_MINIMUM_PER_PROCESS_S[args.device] * machines * local
        return Step("worlds", world_stage_of(args, spec), limit, reserve, partial(run_world, args, spec))

    def tests_step(seconds: float) -> tuple[Stage, dict[str, Any]]:
        return run_tests(args, seconds), {}

    def contract_step(seconds: float) -> tuple[Stage, dict[str, Any]]:
        return run_tests(args, seconds, contract=True), {}

    def compare_step(spec: str) -> Step:
        return Step(
            "compare", compare_stage(spec), args.compare_timeout, COMPARE_MINIMUM_S, partial(run_compare, args, spec)
        )

    # In order of value: what a job meets in its first step (synchronous ops on real NCCL), FSDP2 on a
    # real model against NCCL, the figure against NCCL where the network is the bottleneck, which no CPU
    # machine can give, then the CUDA tests, then the local steps on real NCCL.
    with_local_steps = [spec for spec in args.world_list if parse_layout(spec)[1] > 1]
    versus_skip = why_no_netns()
    stress_skip = "" if args.stress_rounds else "skipped (--stress-rounds 0)"
    todo = [
        Step("contract", CONTRACT_STAGE, args.contract_timeout, CONTRACT_MINIMUM_S, contract_step, tests_skip),
        Step("fsdp2", FSDP2_STAGE, args.fsdp2_timeout, FSDP2_MINIMUM_S, partial(run_fsdp2, args)),
        Step(
            "versus",
            versus_nccl.STAGE,
            args.versus_timeout,
            versus_nccl.MINIMUM_S,
            partial(run_versus, args),
            versus_skip,
            reports_progress=True,
        ),
        Step("tests", TESTS_STAGE, args.tests_timeout, TESTS_MINIMUM_S, tests_step, tests_skip),
        *(world_step(spec) for spec in with_local_steps),
        *(compare_step(spec) for spec in args.compare_list),
        Step("failure", FAILURE_STAGE, args.failure_timeout, FAILURE_MINIMUM_S, partial(run_failure, args)),
        Step("bench", BENCH_STAGE, args.bench_timeout, BENCH_MINIMUM_S, partial(run_bench, args)),
        Step("training", TRAINING_STAGE, args.training_timeout, TRAINING_MINIMUM_S, partial(run_training, args)),
        *(world_step(spec) for spec in args.world_list if spec not in with_local_steps),
        Step("stress", STRESS_STAGE, args.stress_timeout, STRESS_MINIMUM_S, partial(run_stress, args), stress_skip),
        Step("validate", VALIDATE_STAGE, args.validate_timeout, VALIDATE_MINIMUM_S, partial(run_validate, args)),
        Step("nixl", NIXL_STAGE, args.nixl_timeout, NIXL_MINIMUM_S, partial(run_nixl, args), why_no_nixl()),
    ]
    if args.only_list:
        for step in todo:
            if step.key not in args.only_list and not step.skip:
                step.skip = f"skipped (not in --only {','.join(args.only_list)})"
    return todo


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    deadline = time.monotonic() + args.budget
    started = time.monotonic()
    tools = gpu_tools.provide()  # before anything asks whether network namespaces can be made
    info = environment()
    info["iproute2"] = tools
    built = [build_stage(args)]

    def written(stages: list[Stage], summaries: dict[str, dict[str, Any]], left_out: list[str]) -> None:
        write_report(args, argv, info, started, built + stages, summaries, left_out, complete=False)

    if args.device == "cuda" and not torch.cuda.is_available():
        missing = Stage("environment", "failed", detail="no CUDA device is visible to torch (use --device cpu)")
        ran, summaries, left_out = (
            [missing, *(Stage(step.name, detail="skipped: no GPU") for step in steps(args))],
            {},
            [],
        )
    else:
        ran, summaries, left_out = run_steps(steps(args), deadline, written)
        if args.device == "cuda":  # after the stages: this process held no CUDA context while they ran
            info["gpus"] = gpu_names()
    stages = built + ran
    passed = write_report(args, argv, info, started, stages, summaries, left_out)
    failed = [stage.name for stage in stages if stage.status == "failed"]
    print(args.report.read_text().split("\n## Output", 1)[0])
    print(f"gpu-check: {'PASSED' if passed else 'FAILED: ' + ', '.join(failed)}; report: {args.report}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
