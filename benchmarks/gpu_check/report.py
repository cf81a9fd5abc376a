"""The report: Markdown, rewritten after every stage, its data as JSON at the end."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from typing import Any

from benchmarks import versus_nccl
from benchmarks.cuda_bench import check_cases, dtype_name
from fairring._sizes import format_size

from .bench import BENCH_STAGE
from .compare import compare_stage
from .failure import FAILURE_STAGE
from .fsdp2 import FSDP2_STAGE, fsdp2_lines
from .nixl import NIXL_STAGE
from .ranks import BENCH_WORLD
from .stage import Stage, display
from .stress import STRESS_STAGE
from .training import TRAINING_STAGE
from .validate import VALIDATE_STAGE
from .worlds import world_stage, world_stage_of


def cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]


def milliseconds(part: dict[str, Any] | None) -> str:
    return f"{part['median_s'] * 1e3:.3f}" if part else "-"


def percent(value: float | None) -> str:
    return f"{value * 100:.0f}%" if value is not None else "-"


def throughput_lines(rows: list[dict[str, Any]]) -> list[str]:
    header = ["size", "engine ms", "algbw GB/s", "busbw GB/s", "rails seq. ms", "rails conc. ms"]
    header += ["engine vs seq.", "engine vs conc.", "data ok"]
    body = []
    for row in rows:
        parts = [row.get(name) for name in ("engine", "reference_sequential", "reference_concurrent")]
        body.append([
            format_size(row["bytes"]), milliseconds(parts[0]),
            f"{row['algbw_GBps']:.3f}" if "algbw_GBps" in row else "-",
            f"{row['busbw_GBps']:.3f}" if "busbw_GBps" in row else "-",
            milliseconds(parts[1]), milliseconds(parts[2]),
            percent(row.get("fraction_of_sequential")), percent(row.get("fraction_of_concurrent")),
            "yes" if all(part and part["correct"] for part in parts) else "NO",
        ])  # fmt: skip
    return [
        "float32 all_reduce, median of the slower rank's times, each from a barrier to the last wait and a device",
        "synchronize. busbw = algbw x 2(n-1)/n (n = 2). The rails reference moves the bytes the engine must move,",
        "with fairring._C._testing.RailsEndpoint between the same processes: S/2 each way on lane 0, then S/2 on",
        """lane 1 ("seq."), or both halves at once ("conc."). "engine vs" = reference time / engine time.""",
        "",
        *table(header, body),
    ]


def correctness_lines(correctness: dict[str, Any], device: str) -> list[str]:
    if not correctness:
        return ["Not run."]
    cases = check_cases(device)
    dtypes = list(dict.fromkeys(dtype_name(dtype) for dtype, _ in cases))
    ops = list(dict.fromkeys(op for _, op in cases))
    what = (
        f"{len(cases)} (dtype, op) cases x sizes {correctness['sizes']} elements = {correctness['planned_per_rank']}"
        f" per rank; dtypes {', '.join(dtypes)}; ops {', '.join(ops)}; every case of one size in flight at once;"
        " results compared exactly with torch on the CPU (inputs are chosen so that every result is exact)."
    )
    if correctness["all_passed"]:
        return [f"All cases passed on every rank: {what}"]
    failed = correctness["failed"]
    count = correctness["failed_count"]
    rows = [[case["rank"], case["dtype"], case["op"], case["numel"], describe_failure(case)] for case in failed[:60]]
    status = f"{count} case(s) failed" if count else "not every case was checked on every rank"
    lines = [f"FAILED: {status}. {what}", ""]
    lines += table(["rank", "dtype", "op", "elements", "what"], rows)
    return lines + ([f"... and {count - len(rows)} more (the JSON below lists 200)"] if count > len(rows) else [])


def describe_failure(case: dict[str, Any]) -> str:
    if "error" in case:
        return str(case["error"])[:300]
    where, error = case.get("first_bad_index"), case.get("max_abs_error")
    return f"{case.get('mismatches')} wrong elements, first at {where}, max error {error}"


def compare_lines(summary: dict[str, Any]) -> list[str]:
    contenders, rows = summary.get("contenders", []), summary.get("rows", [])
    if not rows:
        return ["Not run."]
    nccl = [f"- `{line}`" for line in summary.get("nccl_info", [])]
    lines = [
        *(["NCCL, rank 0 (NCCL_DEBUG=INFO):", "", *nccl, ""] if nccl else []),
        f"float32 all_reduce on {summary['layout']} (machines x ranks), the same tensors in the same processes,",
        "the order alternated each round; median of the slower rank's times. fairring is its engine at every",
        "size (FAIRRING_FLAT_THRESHOLD=0). One GPU time-sliced between the processes, NCCL over its socket",
        "transport on loopback: this compares code paths on one machine, not a cluster.",
        "",
    ]
    header = ["size", *(f"{name} ms" for name in contenders), *(f"{name} busbw GB/s" for name in contenders)]
    header += [f"fairring vs {name}" for name in contenders[1:]]
    body = []
    for row in rows:
        body.append([
            format_size(row["bytes"]),
            *(f"{row[name]['median_s'] * 1e3:.3f}" for name in contenders),
            *(f"{row[name]['busbw_GBps']:.3f}" for name in contenders),
            *(f"{row[f'fairring_vs_{name}']:.2f}x" for name in contenders[1:]),
        ])  # fmt: skip
    return lines + table(header, body)


def failure_lines(summary: dict[str, Any]) -> list[str]:
    outcomes = summary.get("outcomes", {})
    if not outcomes:
        return ["Not run."]
    lines = [f"Rank {summary['victim']} killed itself (SIGKILL) mid-stream; what each survivor saw:", ""]
    rows = [
        [
            rank,
            f"{outcome.get('seconds', float('nan')):.2f}",
            f"{outcome.get('destroy_seconds', float('nan')):.2f}",
            str(outcome.get("first", ""))[:200].replace("|", "/").replace("\n", " "),
        ]
        for rank, outcome in sorted(outcomes.items())
    ]
    return lines + table(["rank", "error after s", "teardown s", "first error"], rows)


def training_lines(summary: dict[str, Any]) -> list[str]:
    rows = summary.get("rows", [])
    if not rows:
        return ["Not run."]
    body = [
        [
            row["model"],
            row["backend"],
            f"{row['median_s']:.3f}" if row.get("median_s") else "-",
            f"{row['speedup_vs_baseline']:.2f}x" if row.get("speedup_vs_baseline") else "",
            f"{row['loss_gap']:.1e}" if row.get("loss_gap") is not None else "",
        ]
        for row in rows
    ]
    return table(["model", "backend", "step s", "vs baseline", "loss gap"], body)


def stress_lines(stress: dict[str, Any]) -> list[str]:
    if not stress:
        return ["Not run."]
    plan, size, round_bytes = stress["plan"], format_size(stress["bytes"]), stress["ops"] * stress["bytes"]
    what = (
        f"{stress['ops']} float32 sums of {size} in flight at once, {stress['rounds']} rounds, {BENCH_WORLD}"
        f" processes as {BENCH_WORLD} machines; {json.dumps(stress['settings'])}. Each all-reduce:"
        f" {plan['slices']} slice(s) of {format_size(plan['slice_numel'] * 4)}, shards of"
        f" {format_size(plan['shard_bytes'])}, {plan['slices_in_flight']} in flight. Every result compared"
        " exactly (integers in [-128, 133]); a round's time runs from issuing its all-reduces to the last"
        " one's end on the device."
    )
    lines = [what, "", f"engine rails: `{stress.get('engine_rails')}`", ""]
    rows = [
        [index, f"{seconds:.3f}", f"{round_bytes / seconds / 1e9:.3f}"]
        for index, seconds in enumerate(stress["round_seconds"])
    ]
    lines += table(["round", "seconds (slower rank)", "algbw GB/s"], rows) if rows else ["No round finished."]
    failed = stress["failed"]
    if failed:
        body = [[case["rank"], case["round"], case["seed"], describe_failure(case)] for case in failed]
        lines += ["", *table(["rank", "round", "seed", "what"], body)]
    return lines


def validate_lines(summary: dict[str, Any]) -> list[str]:
    paths, comparison = summary.get("paths", {}), summary.get("comparison", [])
    if not paths:
        return ["Not run."]
    lines = [
        "`python -m fairring.validate` under torchrun, 2 agents as 2 machines x 2 ranks: the paths take turns on",
        "the same tensor, median of the slower rank; every element checked (#wrong). Every machine is on this host:",
        "this compares code paths, not a cluster"
        + (" (one GPU time-sliced between the processes, --share-gpu)." if summary["device"] == "cuda" else "."),
        "",
    ]
    names = list(paths)
    header = ["size", *(f"{name} us" for name in names), *(f"{name} busbw GB/s" for name in names)]
    header += [f"vs {names[1]}", "of bound", "#wrong"]
    body = []
    for index, row in enumerate(comparison):
        results = [paths[name][index] for name in names]
        body.append([
            format_size(row["bytes"]), *(f"{result['time_us']:.1f}" for result in results),
            *(f"{result['busbw_GBps']:.3f}" for result in results), f"{row['engine_vs_delegate']:.2f}x",
            percent(row["of_bound"]), sum(result["wrong"] for result in results),
        ])  # fmt: skip
    lines += table(header, body)
    return [*lines, "", f"Bound: {summary['bound_note']}.", "", f"Verdict: {summary['verdict']}"]


def render(report: dict[str, Any], stages: list[Stage]) -> str:
    env, bench = report["environment"], report["bench"]
    if not report["complete"]:
        verdict = "INCOMPLETE (the check is running or was cut short; stages not run yet say so)"
        if not report["passed"]:
            verdict += ", FAILED so far (" + ", ".join(report["failed_stages"]) + ")"
    elif not report["passed"]:
        verdict = "FAILED (" + ", ".join(report["failed_stages"]) + ")"
    elif report["skipped_for_budget"]:
        verdict = "PASSED, but the budget left out: " + ", ".join(report["skipped_for_budget"])
    else:
        verdict = "PASSED"
    lines = [f"# fairring GPU check: {verdict}", ""]
    lines += [f"{env['date']} on {env['host']}, {report['seconds']:.0f} s, --device {report['device']}.", ""]
    gpus = env.get("gpus") or []
    lines += ["## Environment", ""]
    lines += table(["item", "value"], [
        ["python", f"{env['python']} ({env['python_executable']})"],
        ["torch", env["torch"]],
        ["torch.version.cuda", env["torch_cuda"]],
        ["CUDA_HOME", env["cuda_home"]],
        ["compiler", env["compiler"]],
        ["nvcc", env["nvcc"]],
        ["torch.cuda.nccl.version()", env["nccl"]],
        ["fairring", env["fairring"]],
        ["fairring.build_info()", json.dumps(env["fairring_build"])],
        ["GPUs", f"{env['gpu_count']}: {', '.join(gpus)}" if gpus else env["gpu_count"]],
        ["bench GPU", json.dumps(bench.get("gpu")) if bench.get("gpu") else "-"],
        ["nvidia-smi", env.get("nvidia_smi", "not found")],
        ["iproute2 (ip, tc)", env.get("iproute2", "-")],
        ["CPUs", f"{env['cpus']} (nproc {env['nproc']})"],
        ["environment", json.dumps(env["environment"])],
    ])  # fmt: skip
    lines += ["", "## FSDP2 on GPT-124M, the engine against NCCL", ""]
    lines += fsdp2_lines(report["fsdp2"], table)
    lines += ["", "## Versus NCCL, the network the bottleneck", ""]
    lines += versus_nccl.lines(report["versus"], table, percent)
    lines += ["", "## Stages", ""]
    lines += table(
        ["stage", "status", "seconds", "detail"],
        [[stage.name, stage.status, f"{stage.seconds:.1f}", stage.detail] for stage in stages],
    )
    lines += ["", "## Commands", "", "```sh", report["command"]]
    lines += [command for stage in stages for command in stage.commands]
    lines += ["```", "", "## Throughput", ""]
    lines += throughput_lines(bench.get("throughput", [])) if bench else ["Not run."]
    lines += ["", "## Correctness", "", f"{BENCH_WORLD} processes as {BENCH_WORLD} machines (the bench):", ""]
    lines += correctness_lines(bench.get("correctness", {}), report["device"])
    for spec, summary in report["worlds"].items():
        lines += ["", world_stage(spec).removeprefix("correctness: ") + ":", ""]
        lines += correctness_lines(summary.get("correctness", {}), report["device"])
    lines += ["", "## Side by side"]
    for summary in report["compare"].values():
        lines += ["", *compare_lines(summary)]
    lines += ["", "## A rank killed", "", *failure_lines(report["failure"])]
    lines += ["", "## Training", "", *training_lines(report["training"])]
    lines += ["", "## Stress", "", *stress_lines(report["stress"])]
    lines += ["", "## Validate", "", *validate_lines(report["validate"])]
    nixl = report["nixl"]
    lines += [
        "",
        "## NIXL rails",
        "",
        "The engine with FAIRRING_RAILS_TRANSPORT=nixl; the rails reference is TensorPipe's.",
        "",
    ]
    lines += throughput_lines(nixl.get("throughput", [])) if nixl else ["Not run."]
    if nixl:
        lines += ["", *correctness_lines(nixl.get("correctness", {}), report["device"])]
    lines += ["", "## Engine", "", f"engine_stats per rank: `{json.dumps(bench.get('engine_stats'))}`", ""]
    lines += [
        f"engine rails: `{bench.get('engine_rails')}`",
        "",
        f"reference endpoint: `{bench.get('reference_endpoint')}`",
    ]
    by_stage = {BENCH_STAGE: bench, STRESS_STAGE: report["stress"], NIXL_STAGE: nixl}
    by_stage.update({compare_stage(spec): summary for spec, summary in report["compare"].items()})
    by_stage["failure"] = report["failure"]
    by_stage["training"] = report["training"]
    by_stage["fsdp2"] = report["fsdp2"]
    by_stage["versus"] = report["versus"]
    by_stage["validate"] = report["validate"]
    by_stage.update({world_stage(world): summary for world, summary in report["worlds"].items()})
    problems = [f"{name}: {problem}" for name, summary in by_stage.items() for problem in summary.get("problems", [])]
    if problems:
        lines += ["", "## Problems", "", *[f"- {problem}" for problem in problems]]
    lines += ["", "## Output"]
    for stage in stages:
        if stage.output_tail:
            lines += ["", f"### {stage.name}", "", "```text", stage.output_tail.rstrip(), "```"]
    lines += ["", "## Data", "", "```json", json.dumps(report, indent=1, default=str), "```", ""]
    return "\n".join(lines)


def write_report(
    args: argparse.Namespace,
    argv: list[str],
    info: dict[str, Any],
    started: float,
    stages: list[Stage],
    summaries: dict[str, dict[str, Any]],
    left_out: list[str],
    complete: bool = True,
) -> bool:
    """Writes the report as it stands (`complete`: every stage has had its turn); whether none failed."""
    failed = [stage.name for stage in stages if stage.status == "failed"]
    report = {
        "complete": complete,
        "passed": not failed,
        "failed_stages": failed,
        "skipped_for_budget": left_out,
        "device": args.device,
        "seconds": time.monotonic() - started,
        "command": display([sys.executable, "-m", "benchmarks.gpu_check", *argv]),
        "environment": info,
        "stages": [{k: v for k, v in asdict(stage).items() if k != "output_tail"} for stage in stages],
        "bench": summaries.get(BENCH_STAGE, {}),
        "worlds": {spec: summaries.get(world_stage_of(args, spec), {}) for spec in args.world_list},
        "compare": {spec: summaries.get(compare_stage(spec), {}) for spec in args.compare_list},
        "failure": summaries.get(FAILURE_STAGE, {}),
        "training": summaries.get(TRAINING_STAGE, {}),
        "fsdp2": summaries.get(FSDP2_STAGE, {}),
        "versus": summaries.get(versus_nccl.STAGE, {}),
        "stress": summaries.get(STRESS_STAGE, {}),
        "validate": summaries.get(VALIDATE_STAGE, {}),
        "nixl": summaries.get(NIXL_STAGE, {}),
    }
    args.report.parent.mkdir(parents=True, exist_ok=True)
    partial = args.report.with_suffix(".partial")
    partial.write_text(render(report, stages))
    partial.replace(args.report)
    return not failed
