"""The failure stage: the last rank of 2 machines x 2 ranks kills itself; the survivors must name it."""

from __future__ import annotations

import argparse
from typing import Any

from fairring._config import FLAT_THRESHOLD

from .ranks import run_ranks
from .stage import Stage, conclude

# The failure stage: 2 machines x 2 ranks, the last killed; each op's timeout, and how much later than it a
# survivor may see the failure (the engine's settling, then NCCL's abort) or take to tear down.
FAILURE_STAGE = "failure: rank 3 of 2 machines x 2 ranks killed mid-stream"
FAILURE_WORLD, FAILURE_LOCAL = 4, 2
FAILURE_OP_TIMEOUT_S = 20.0
FAILURE_SLACK_S = 15.0
# After the failure, a collective of the failed group is refused with its cause, not run.
LATER_REFUSAL_S = 5.0


def run_failure(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    """Rank 3 of 2x2 killed mid-stream: each survivor names it within its timeout, then tears down."""
    stage = Stage(FAILURE_STAGE)
    victim = FAILURE_WORLD - 1
    phases = ["--kill-rank", str(victim), "--op-timeout", str(FAILURE_OP_TIMEOUT_S)]
    ranks, problems = run_ranks(
        args, stage, FAILURE_WORLD, phases, {FLAT_THRESHOLD: "0"}, timeout, FAILURE_LOCAL, victim
    )
    outcomes = {rank: (result or {}).get("failure", {}) for rank, result in ranks.items() if rank != victim}
    for rank, outcome in outcomes.items():
        if not outcome:
            problems.append(f"rank {rank} recorded no failure")
            continue
        if not outcome.get("names_victim"):
            problems.append(f"rank {rank}'s error does not name rank {victim}: {str(outcome.get('first'))[:300]}")
        if outcome.get("seconds", float("inf")) > FAILURE_OP_TIMEOUT_S + FAILURE_SLACK_S:
            problems.append(f"rank {rank} saw the failure after {outcome.get('seconds')} s")
        if not outcome.get("device_drained"):
            problems.append(
                f"rank {rank}'s device did not drain within the op timeout after the failure: the delegate's "
                "kernels in flight were not ended"
            )
        later = str(outcome.get("later_broadcast"))
        if later == "completed" or outcome.get("later_broadcast_seconds", float("inf")) > LATER_REFUSAL_S:
            problems.append(
                f"rank {rank}'s later broadcast was not refused at once "
                f"({outcome.get('later_broadcast_seconds')} s): {later[:300]}"
            )
        if outcome.get("destroy_seconds", float("inf")) > FAILURE_SLACK_S or "destroy_error" in outcome:
            problems.append(
                f"rank {rank}'s teardown: {outcome.get('destroy_seconds')} s, {outcome.get('destroy_error')}"
            )
    summary = {"victim": victim, "outcomes": outcomes, "problems": []}
    return conclude(
        stage, summary, problems, f"every survivor named rank {victim}, refused a later broadcast and tore down"
    )
