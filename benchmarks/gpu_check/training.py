"""The training stage: the training study's quick part, fairring's losses against the baseline's."""

from __future__ import annotations

import argparse
from typing import Any

from fairring.bench import training
from fairring.bench.training_plots import model_name

from .processes import run_fairring_bench
from .stage import Stage, conclude

TRAINING_STAGE = "training: the study's quick part on 2 machines x 2 ranks"


def run_training(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    """The training study's quick part: tiny models trained by DDP (and the transformer by FSDP2) on 2x2,
    fairring against the baseline (NCCL on a GPU, Gloo on the CPU) from the same weights on the same data."""
    stage = Stage(TRAINING_STAGE)
    arguments = ["--study", "training", "--quick", "--loopback", *(["--cuda"] if args.device == "cuda" else [])]
    records, problems = run_fairring_bench(stage, arguments, timeout)
    fairring_records = [record for record in records if record["backend"] == "fairring"]
    runs = len(training.QUICK_RUNS)
    if len(fairring_records) != runs or len(records) != 2 * runs:
        problems.append(
            f"{len(records)} records, {len(fairring_records)} of them fairring's (expected {2 * runs}, {runs})"
        )
    for record in fairring_records:
        # fp32 to 1e-5 relative, bf16 autocast to 1e-2, as the study's own reading.
        tolerance = 1e-2 if record["autocast"] else 1e-5
        name = model_name(record)
        if record.get("loss_gap") is None or record["loss_gap"] >= tolerance:
            problems.append(f"{name}: loss gap {record.get('loss_gap')} against {record.get('baseline')}")
        if not record.get("engine_all_reduces"):
            problems.append(f"{name}: no collective went to the engine")
    if "Reading: with real compute" not in stage.output_tail:
        problems.append("the study printed no reading of its losses and speeds")
    rows = [
        {
            "model": model_name(record),
            **{key: record.get(key) for key in ("backend", "median_s", "speedup_vs_baseline", "loss_gap")},
        }
        for record in records
    ]
    return conclude(stage, {"rows": rows, "problems": []}, problems, "losses agree with the baseline's")
