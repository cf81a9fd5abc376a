"""The time rule: each stage runs for at most its limit less the later stages' reserves, and at least
its own reserve while --budget lasts; one that the budget no longer fits is recorded as skipped."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from traceback import format_exc
from typing import Any

from .stage import Stage, tail

# A stage left less than this is skipped; writing the report takes the last few seconds.
STAGE_MINIMUM_S = 10.0
REPORT_RESERVE_S = 5.0

# Each stage's reserve: what the stages before it leave it of the budget, and what it may take
# from the stages after it when the budget runs short: the bench needs about 120 s, the tests
# 100 s, the correctness layouts by their processes (below), the others less. Versus NCCL's is
# benchmarks/versus_nccl.py's MINIMUM_S.
# test_cuda.py: on an H200 (2026-11-28), 5 of its 9 tests, the 2x1 and 2x2 engine checks among
# them, took the stage's 100 s; the other 4 run a 2x1 or 2x2 each.
TESTS_MINIMUM_S = 200.0
# The contract stage: one 2 x 2 pool, 4 processes on one GPU, 56 collectives each (not yet timed on a GPU).
CONTRACT_MINIMUM_S = 60.0
# A correctness layout's time grows with its processes, which share one GPU: on an H200, 2x2 took
# 77 s, 3x2 130 s, 3 processes 41 s and 4 (one per machine) 67 s, so about 22 s a process.
WORLD_MINIMUM_PER_PROCESS_S = {"cuda": 24.0, "cpu": 8.0}
WORLD_LIMIT_PER_PROCESS_S = 30.0
COMPARE_MINIMUM_S = 45.0
FAILURE_MINIMUM_S = 40.0
BENCH_MINIMUM_S = 120.0
# Three models (two DDP, one FSDP2), each on NCCL and on fairring: 60 s cut the third on an H200,
# which alone took 27 s.
TRAINING_MINIMUM_S = 100.0
# GPT-124M by FSDP2 on 2 x 2, 8 steps on each backend, launch included (not yet timed on a GPU).
FSDP2_MINIMUM_S = 90.0
STRESS_MINIMUM_S = 60.0
VALIDATE_MINIMUM_S = 30.0
NIXL_MINIMUM_S = 45.0


@dataclass
class Step:
    """A stage to run: at most `limit` seconds; the stages before it leave it `reserve` seconds."""

    key: str  # its short name, for --only (cli.STAGE_KEYS)
    name: str
    limit: float
    reserve: float
    run: Callable[..., tuple[Stage, dict[str, Any]]]
    skip: str = ""  # why it does not run at all, whatever the budget
    # Whether run also takes progress=: a callable(stage, summary) that writes the report with what the
    # stage has found so far, for a stage of several long parts.
    reports_progress: bool = False


def run_steps(
    todo: list[Step], deadline: float, written: Callable[[list[Stage], dict[str, dict[str, Any]], list[str]], None]
) -> tuple[list[Stage], dict[str, dict[str, Any]], list[str]]:
    """Each stage, what it found by stage name, and the stages the budget left out; `written` is
    called after each stage, so that a check cut short has reported what it ran."""
    stages: list[Stage] = []
    summaries: dict[str, dict[str, Any]] = {}
    left_out: list[str] = []
    for index, step in enumerate(todo):
        if step.skip:
            stages.append(Stage(step.name, detail=step.skip))
            continue
        left = deadline - time.monotonic() - REPORT_RESERVE_S
        kept = sum(later.reserve for later in todo[index + 1 :] if not later.skip)
        seconds = min(step.limit, left, max(left - kept, step.reserve, STAGE_MINIMUM_S))
        if seconds < STAGE_MINIMUM_S:
            stages.append(Stage(step.name, detail=f"skipped: {max(left, 0):.0f} s of the budget left"))
            left_out.append(step.name)
            continue
        not_yet = [Stage(later.name, detail="not run yet") for later in todo[index + 1 :]]
        begun = time.monotonic()

        def progress(
            stage: Stage, summary: dict[str, Any], name: str = step.name, after: list = not_yet, begun: float = begun
        ) -> None:
            running = Stage(stage.name, "running", time.monotonic() - begun, "parts so far", stage.commands)
            written([*stages, running, *after], {**summaries, name: summary}, left_out)

        try:
            extra = {"progress": progress} if step.reports_progress else {}
            stage, summaries[step.name] = step.run(seconds, **extra)
        except Exception:
            stage = Stage(step.name, "failed", detail="the check itself failed", output_tail=tail(format_exc()))
        stages.append(stage)
        written(stages + not_yet, summaries, left_out)
    return stages, summaries, left_out
