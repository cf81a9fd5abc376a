"""The command: arguments, then on every rank the groups, the sweep, and rank 0's report."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import fairring
from fairring._config import ConfigError
from fairring._introspection import delegate_name
from fairring._sizes import SIZE_HELP, format_size, parse_size
from fairring.bench.collectives import COLLECTIVES
from fairring.bench.worker import environment

from . import report
from .check import DTYPES, TYPE_NAMES, max_ranks
from .launch import LaunchError, Placement, die_with_parent, placement, rank_device
from .network import describe_rank, grouped, network_fields, nic_bound
from .sweep import ENGINE, Contender, Row, Sweep, element_counts, geometric_sizes, make_paths

# -b, -e, -f by device: sizes where a cluster's network, not latency, decides.
DEFAULT_SIZES = {"cuda": ("1MiB", "1GiB"), "cpu": ("64KiB", "64MiB")}
EMULATED_DEVICE = "FAIRRING_TEST_EMULATED_DEVICE"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fairring.validate",
        description="Validate fairring's all-reduce (or reduce-scatter, all-gather) on a cluster, nccl-tests "
        "style: run it on every rank "
        "(torchrun, or srun with MASTER_ADDR and MASTER_PORT exported). Reference: docs/validating.md.",
        epilog=f"Sizes: {SIZE_HELP}. -b, -e, -f, -n and -w are nccl-tests' flags, as python -m fairring.bench "
        "takes them.",
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda where torch sees a GPU, else cpu")
    parser.add_argument(
        "--collective", choices=sorted(COLLECTIVES), default="all_reduce",
        help="default all_reduce; sizes are of the N-chunk tensor, as nccl-tests' reduce_scatter_perf and "
        "all_gather_perf count them, in place unless --out-of-place",
    )  # fmt: skip
    parser.add_argument(
        "--in-flight", type=int, default=1, metavar="K",
        help="ops issued back to back before any is waited for, each on its own buffers; times are per op, "
        "as nccl-tests reports them (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--out-of-place", action="store_true",
        help="a reduce-scatter's output and an all-gather's input in buffers of their own, as nccl-tests' "
        "out-of-place column (c10d's all_reduce is in place only)",
    )  # fmt: skip
    parser.add_argument(
        "--share-gpu", action="store_true", help="every rank on GPU 0, each its own NCCL host (one-GPU test machines)"
    )
    parser.add_argument("-b", "--minbytes", help="smallest size (default 1MiB on cuda, 64KiB on cpu)")
    parser.add_argument("-e", "--maxbytes", help="largest size (default 1GiB on cuda, 64MiB on cpu)")
    parser.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier between steps (default 4)")
    parser.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    parser.add_argument("-w", "--warmup_iters", type=int, default=5, help="untimed iterations first (default 5)")
    parser.add_argument("-d", "--datatype", choices=tuple(DTYPES), default="float32", help="default float32")
    parser.add_argument(
        "--nic-gbps", type=float, help="each machine's NIC rate in Gbit/s, all its rails' NICs together "
        "(default: read from /sys/class/net/<interface>/speed)"
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write every result here (rank 0)")
    # torch's meaning (init_process_group's timeout); the bench's limit on its whole run is --time-limit.
    parser.add_argument(
        "--timeout", type=float, default=600.0, metavar="S",
        help="seconds any one collective may take, as torch's process-group timeout (default 600)",
    )  # fmt: skip
    # The negative control of the checker (tests/test_validate.py): rank 0 damages the engine's results.
    parser.add_argument("--corrupt-for-test", action="store_true", help=argparse.SUPPRESS)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.stepfactor < 2 or args.iters < 1 or args.warmup_iters < 0:
        parser.error("--stepfactor must be >= 2, --iters >= 1 and --warmup_iters >= 0")
    try:
        args.sizes = sweep_sizes(args)
    except ConfigError as error:
        parser.error(str(error))
    if args.nic_gbps is not None and args.nic_gbps <= 0:
        parser.error("--nic-gbps must be positive")
    if args.in_flight < 1:
        parser.error("--in-flight must be >= 1")
    if args.out_of_place and args.collective == "all_reduce":
        parser.error(
            "--out-of-place is for --collective reduce_scatter or all_gather: c10d's all_reduce writes its input"
        )
    if args.share_gpu and args.device != "cuda":
        parser.error("--share-gpu is for --device cuda")
    return args


def sweep_sizes(args: argparse.Namespace) -> list[int]:
    """-b, -e and -f as nccl-tests reads them, with the device's defaults."""
    smallest, largest = DEFAULT_SIZES[args.device]
    first = parse_size("--minbytes", args.minbytes or smallest)
    last = parse_size("--maxbytes", args.maxbytes or largest)
    if first > last:
        raise ConfigError(f"--minbytes ({format_size(first)}) is larger than --maxbytes ({format_size(last)})")
    return geometric_sizes(first, last, args.stepfactor)


def check_world(args: argparse.Namespace, where: Placement) -> None:
    limit = max_ranks(DTYPES[args.datatype])
    if where.world_size > limit:
        raise LaunchError(
            f"-d {args.datatype}: the checked sums stay exact up to {limit} ranks, and this job has "
            f"{where.world_size}: use -d float32"
        )
    if where.world_size < 2:
        raise LaunchError(f"WORLD_SIZE is 1: {args.collective} needs 2 or more ranks to compare")


# The exit status of a run in which the engine served nothing: no comparison, no verdict.
NOTHING_JUDGED = 3


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    die_with_parent()
    try:
        where = placement(os.environ)
        check_world(args, where)
        device = rank_device(args.device, where, args.share_gpu, os.environ)
    except LaunchError as error:
        print(f"fairring.validate: {error}", file=sys.stderr)
        return 2
    timeout = timedelta(seconds=args.timeout)
    # Gloo coordinates (barriers, the slowest rank's times, the report); the paths get groups of their own.
    dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    try:
        wrong, judged = validate(Run(args, argv, where, device), timeout)
    finally:
        dist.destroy_process_group()
    # As nccl-tests: a wrong result fails; so does a run that compared nothing (the output said why).
    return 1 if wrong else 0 if judged else NOTHING_JUDGED


def first_engine_all_reduce(path: Contender, device: torch.device) -> None:
    """Makes the engine (its rails, staging, local groups), which the group's first all-reduce does."""
    dist.all_reduce(torch.ones(1024, device=device), group=path.group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_line(device: torch.device) -> str:
    name = f" [{torch.cuda.get_device_name(device)}]" if device.type == "cuda" else ""
    return f"#  Rank {dist.get_rank():>3} Pid {os.getpid():>7} on {platform.node()} device {device}{name}"


def header(args: argparse.Namespace, where: Placement, paths: list[Contender], device: torch.device) -> list[str]:
    """Every rank's line, gathered; rank 0 gets the header to print."""
    lines: list[Any] = [None] * where.world_size
    dist.all_gather_object(lines, rank_line(device))
    topology = fairring.backend_of(paths[0].group, device).topology
    sizes = list(topology.machine_sizes)
    layout = (
        f"{topology.num_machines} machines x {topology.local_size} ranks" if topology.regular else "uneven machines"
    )
    emulated = os.environ.get(EMULATED_DEVICE)
    out = [
        f"# fairring.validate: {args.collective}{redop_note(redop_of(args.collective))} of {args.datatype} "
        f"on {args.device}" + (f" (the emulated CUDA device: {EMULATED_DEVICE}={emulated})" if emulated else ""),
        f"# {where.world_size} ranks: {layout} (ranks per machine {sizes}), started by {where.launcher}",
        f"# sizes {args.sizes[0]} to {args.sizes[-1]} B, factor {args.stepfactor}; {args.iters} timed iterations "
        f"after {args.warmup_iters} warm-up(s) per size and path; the paths take turns, order alternating; "
        f"{placement_text(args)}, {args.in_flight} op(s) in flight",
        *lines,
    ]
    if not topology.serves_engine:
        out.append(
            "# note: fairring's engine does not serve this layout (one machine, or machines with different "
            f"numbers of ranks): its {args.collective} takes the delegate's, so both columns time the delegate"
        )
    return [*out, *(f"# path {path.name}: {path.description}" for path in paths), "#"]


def placement_text(args: argparse.Namespace) -> str:
    return "out of place" if args.out_of_place else "in place"


def redop_of(collective: str) -> str | None:
    """The reduce op it checks: a sum, except for an all-gather, which reduces nothing."""
    return None if collective == "all_gather" else "sum"


def redop_note(redop: str | None) -> str:
    return f" ({redop})" if redop else ""


def progress(rows: dict[str, Row]) -> str:
    first = next(iter(rows.values()))
    times = ", ".join(f"{name} {row.median_s * 1e6:.2f} us" for name, row in rows.items())
    return f"# {first.nbytes} B: {times}; {sum(row.wrong for row in rows.values())} wrong"


def sweep_all(args: argparse.Namespace, paths: list[Contender], device: torch.device) -> dict[str, list[Row]]:
    dtype = DTYPES[args.datatype]
    sweep = Sweep(
        paths, dist.group.WORLD, device, dtype, args.iters, args.warmup_iters, args.corrupt_for_test, args.collective,
        args.in_flight, args.out_of_place,
    )  # fmt: skip
    rows: dict[str, list[Row]] = {path.name: [] for path in paths}
    chunks = 1 if args.collective == "all_reduce" else dist.get_world_size()
    for count in element_counts(args.sizes, dtype, chunks):
        measured = sweep.run(count)
        for name, row in measured.items():
            rows[name].append(row)
        if dist.get_rank() == 0:
            print(progress(measured), flush=True)
    return rows


@dataclasses.dataclass(frozen=True)
class Run:
    """What every step of one validation needs."""

    args: argparse.Namespace
    argv: list[str]
    where: Placement
    device: torch.device


def validate(run: Run, timeout: timedelta) -> tuple[int, bool]:
    """Every rank: the paths, the sweep, what the rails used; rank 0 reports.

    Returns the wrong elements, and whether the engine served the engine path (else nothing was judged)."""
    paths = make_paths(run.device, timeout)
    engine = paths[0]
    before = network_fields(engine.group, run.device)
    first_engine_all_reduce(engine, run.device)
    lines = header(run.args, run.where, paths, run.device)
    if run.where.rank == 0:
        print("\n".join(lines), flush=True)
    rows = sweep_all(run.args, paths, run.device)
    ranks: list[Any] = [None] * run.where.world_size
    dist.all_gather_object(ranks, describe_rank(engine.group, run.device, before))
    # What fairring's own summary says of the engine's group: the figures a real job's would give.
    said = fairring.summary(engine.group, nic_gbps=run.args.nic_gbps)
    if run.where.rank == 0:
        document = summarize(run, paths, rows, ranks)
        document["fairring_summary"] = [vars(row) for row in said.rows]
        print(f"# fairring.summary(engine group): {said.line()}", flush=True)
        print("\n".join(report_lines(run, paths, document)), flush=True)
    wrong = sum(row.wrong for path_rows in rows.values() for row in path_rows)
    return wrong, engine_served(fairring.backend_of(engine.group, run.device).engine_stats(run.device.type))


def engine_served(stats: dict[str, Any] | None) -> bool:
    """Whether the engine ran the engine path's all-reduces (and none went to the delegate)."""
    return bool(stats) and stats["ops"] > 0 and not stats["flat_ops"]


def summarize(
    run: Run, paths: list[Contender], rows: dict[str, list[Row]], ranks: list[dict[str, Any]]
) -> dict[str, Any]:
    """Rank 0: every result, the comparison, the bound, the rails and the verdict, as the JSON holds them."""
    args, device = run.args, run.device
    backend = fairring.backend_of(paths[0].group, device)
    topology, stats = backend.topology, backend.engine_stats(device.type)
    delegate = delegate_name(device)
    collective = args.collective
    world = run.where.world_size
    results = {name: [report.row_record(row, world, collective) for row in found] for name, found in rows.items()}
    bound = nic_bound(ranks, args.nic_gbps)
    wrong = sum(record["wrong"] for records in results.values() for record in records)
    return {
        "command": ["python", "-m", "fairring.validate", *run.argv],
        # As the bench's records have it: python, torch, fairring.build_info() (its version too), the FAIRRING_
        # variables and the settings they make; the engine path's own fairring.Options are in its description.
        "environment": environment(device.type),
        "launcher": run.where.launcher,
        "device": device.type,
        "emulated_device": os.environ.get(EMULATED_DEVICE),
        "collective": collective,
        "dtype": args.datatype,
        "redop": redop_of(collective),
        "world_size": run.where.world_size,
        "machines": topology.num_machines,
        "machine_sizes": list(topology.machine_sizes),
        "iters": args.iters,
        "warmup_iters": args.warmup_iters,
        "in_flight": args.in_flight,
        "in_place": not args.out_of_place,
        "paths": {path.name: {"description": path.description, "results": results[path.name]} for path in paths},
        "comparison": report.comparison(results, delegate, bound, topology.num_machines, collective),
        "bound": dataclasses.asdict(bound),
        "bound_note": report.bound_note(bound, topology.num_machines, collective),
        "rails": grouped(ranks),
        "rails_chosen_by_first_all_reduce": any(rank["chosen_by_first_all_reduce"] for rank in ranks),
        "ranks": ranks,
        "engine_stats": stats,
        "wrong": wrong,
        "verdict": dataclasses.asdict(judge(results, delegate, device, wrong, engine_served(stats), collective)),
    }


def report_lines(run: Run, paths: list[Contender], document: dict[str, Any]) -> list[str]:
    """Rank 0's tables, the rails and, last, the verdict; writes the JSON where --json asks."""
    type_name = TYPE_NAMES[DTYPES[run.args.datatype]]
    results = {name: path["results"] for name, path in document["paths"].items()}
    lines = []
    redop = redop_of(run.args.collective) or "none"
    for path in paths:
        lines += report.path_table(path.name, results[path.name], type_name, redop, placement_text(run.args))
    delegate = delegate_name(run.device)
    lines += report.comparison_table(document["comparison"], results, delegate, document["bound_note"])
    lines += report.rails_lines(document["rails"], document["rails_chosen_by_first_all_reduce"])
    lines.append(f"# engine_stats (rank 0): {json.dumps(document['engine_stats'])}")
    if run.args.json:
        run.args.json.parent.mkdir(parents=True, exist_ok=True)
        run.args.json.write_text(json.dumps(document, indent=1))
        lines.append(f"# results: {run.args.json}")
    return [*lines, document["verdict"]["text"]]


def judge(
    results: dict[str, list[dict[str, Any]]],
    delegate: str,
    device: torch.device,
    wrong: int,
    served: bool,
    collective: str = "all_reduce",
) -> report.Verdict:
    if not served and not wrong:
        text = (
            f"fairring's engine served none of the engine path's {collective} ops (one machine, or machines with "
            "different numbers of ranks), so there is nothing to judge: run on 2+ machines with equal ranks."
        )
        return report.Verdict(False, None, None, text)
    engine_us = [record["time_us"] for record in results[ENGINE]]
    delegate_us = [record["time_us"] for record in results[delegate]]
    sizes = [record["bytes"] for record in results[ENGINE]]
    return report.verdict(sizes, engine_us, delegate_us, device.type, delegate, wrong)
