"""fairring's collectives microbenchmark, against Gloo (CPU) or NCCL (CUDA) in the same run.

Ranks run on local processes that emulate machines: each machine is its own
torchrun agent (`--nnodes M --node-rank i`), so ranks learn their machine from
torchrun's GROUP_RANK exactly as on a cluster. By default, where network
namespaces can be made (root, iproute2), each machine is also a separate host:
a network namespace with its own NIC, shaped to 1 Gbit/s, so that the network
rather than this machine's CPUs bounds the run, as on a real cluster. Elsewhere,
or with --loopback, the machines share loopback, where the CPUs are the
bottleneck: that measures fairring's overhead, not what it is for.

    python -m fairring.bench                  # 2 hosts x 2 ranks, 1 Gbit/s NICs, 1 MiB .. 64 MiB
    python -m fairring.bench --loopback       # 2 machines x 2 ranks on loopback, 4 KiB .. 16 MiB
    python -m fairring.bench --hosts 2 --ranks-per-host 2 --link 1gbit -b 1MiB -e 100MiB -f 10 -n 5 -w 2
    python -m fairring.bench --link 1gbit --study overlap      # 64 x 25 MiB, 1/2/4/8 slices in flight
    python -m fairring.bench --link 1gbit --study scaling --hosts 4
    python -m fairring.bench --timeline       # and draw the last all-reduce's stages, rank by rank
    python -m fairring.bench --study training # real and emulated-compute DDP training, against Gloo
    python -m fairring.bench --study dispatch # 2x2, 4x2, 8x1 (--layouts): both paths, and what auto chose
    python -m fairring.bench --link 10gbit --study compare --sizes 4MiB,64MiB   # engine, baseline, auto; alternated
    python -m fairring.bench --link 1gbit --collective reduce_scatter --sizes 4MiB,64MiB   # FSDP's gradients

Studies: single (one all-reduce per size), overlap (many buckets back to back,
with staging sized for 1, 2, 4, 8 slices in flight), scaling (the same
all-reduce over 1, 2, ... machines), all (those three), training (DDP training
end to end: fairring.bench.training), dispatch (FAIRRING_FLAT_THRESHOLD=auto's
choice against the sweep it should match, on 2x2, 4x2 and 8x1), compare (at each
size the engine, the baseline and a group whose path auto measures, on the same
tensors, the order rotated every iteration: the GPU check's figure against NCCL).

It prints a line per measurement as it goes, then writes the records (--json)
and plots (--plots; matplotlib and numpy, the bench extra, which the run checks
for first), and ends with a sentence read from the results.

The sweep's flags are nccl-tests' and fairring.validate's: -b/--minbytes,
-e/--maxbytes, -f/--stepfactor, -n/--iters, -w/--warmup_iters. --begin, --end,
--factor and --warmup, their names before, and --timeout, --time-limit's, still
work, saying so on stderr, until the next release.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from fairring._config import (
    AUTO_CACHE,
    CUDA_ENGINE,
    ENGINE_OFF_THRESHOLD,
    FLAT_THRESHOLD,
    RAILS_TRANSPORT,
    RAILS_TRANSPORTS,
    ConfigError,
)
from fairring._dispatch import NO_CEILING, SizeTiming, choose_sizes, ladder
from fairring._sizes import format_bytes, format_rate, parse_rate, parse_size

from . import BASELINE_NAMES
from .collectives import COLLECTIVES
from .launch import Run, hosts_for, run_agents
from .netns import check_mtu, netns_available
from .training import add_training_arguments, parse_layouts, run_training_study

# The default NIC of an emulated host: what the results in docs/benchmarks.md were measured with.
DEFAULT_LINK = "1gbit"
# -b, -e, -f by setting: on a shaped link, sizes whose transfer the link bounds (at 1 Gbit/s, 64 MiB
# takes about 0.6 s per all-reduce); on loopback, the range where latency turns into bandwidth.
SHAPED_SIZES = ("1MiB", "64MiB", 4)
LOOPBACK_SIZES = ("4KiB", "16MiB", 8)
# What the plots need: the bench extra (pyproject.toml), checked before the run rather than met after it.
PLOT_PACKAGES = ("matplotlib", "numpy")
# --timeline with no trace files: an extension from before FAIRRING_TIMELINE, or a run on one machine.
NO_TRACES = "the extension wrote none (a build without FAIRRING_TIMELINE, or no all-reduce ran on its engine)"


class _Renamed(argparse.Action):
    """Stores the value; under `old`, the name an option had before, it also says the new name on stderr.

    fairring.validate and nccl-tests name the sweep's flags -b/--minbytes and so on; the bench's own names
    before them stay for one release."""

    def __init__(self, option_strings: list[str], dest: str, old: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.old = old

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string == self.old:
            new = next(name for name in self.option_strings if name.startswith("--"))
            print(f"{parser.prog}: {self.old} is deprecated and goes in the next release: use {new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _add_renamed(parser: argparse.ArgumentParser, *names: str, old: str, **kwargs: Any) -> None:
    """An option under its names and, deprecated, its old one (its dest, which the bench's code reads)."""
    parser.add_argument(*names, old, dest=old.lstrip("-"), action=_Renamed, old=old, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fairring.bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1] + "\nSizes accept units (4KiB, 25MiB, 1GiB).",
    )
    parser.add_argument("--machines", "--hosts", type=int, default=2, help="emulated machines (default 2)")
    parser.add_argument(
        "--ranks-per-machine",
        "--ranks-per-host",
        "--ranks",
        type=int,
        default=2,
        help="ranks per machine (default 2)",
    )
    # nccl-tests' names, as fairring.validate's; the old ones go in the next release.
    _add_renamed(
        parser, "-b", "--minbytes", old="--begin", metavar="SIZE",
        help="smallest size (default 1MiB on shaped hosts, else 4KiB)",
    )  # fmt: skip
    _add_renamed(
        parser, "-e", "--maxbytes", old="--end", metavar="SIZE",
        help="largest size (default 64MiB on shaped hosts, else 16MiB)",
    )  # fmt: skip
    _add_renamed(
        parser, "-f", "--stepfactor", old="--factor", type=int, metavar="FACTOR",
        help="size multiplier between steps (default 4 on shaped hosts, else 8)",
    )  # fmt: skip
    parser.add_argument("--sizes", help="explicit comma-separated sizes, instead of -b/-e/-f")
    parser.add_argument("-n", "--iters", type=int, default=5, help="timed iterations per size (default 5)")
    _add_renamed(
        parser, "-w", "--warmup_iters", old="--warmup", type=int, default=2, metavar="N",
        help="untimed iterations first (default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--link",
        help=f"shape each host's NIC to this tc rate (e.g. 100mbit); implies --netns. Default: {DEFAULT_LINK} "
        "where network namespaces can be made, else --loopback",
    )
    parser.add_argument(
        "--mtu",
        type=int,
        help="the emulated NICs' MTU (default: the kernel's, 1500); e.g. 9000 for the jumbo frames of "
        "datacenter networks. Needs --link or --netns",
    )
    parser.add_argument(
        "--netns", action="store_true", help="run each machine as a host in a network namespace, NIC unshaped"
    )
    parser.add_argument(
        "--loopback",
        action="store_true",
        help="run every machine on this host's loopback (measures overhead: the CPUs are the bottleneck)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="VAR=VALUE",
        help="environment for the ranks, e.g. FAIRRING_SLICE_SIZE=4MiB",
    )
    parser.add_argument(
        "--study",
        default="single",
        choices=("single", "overlap", "scaling", "transports", "dispatch", "compare", "all", "training"),
        help="what to measure (default single; see below)",
    )
    parser.add_argument(
        "--collective",
        default="all_reduce",
        type=collective_names,
        help="what the single and compare studies time (default all_reduce), or several, comma-separated, timed "
        "one after another in one launch; sizes are the N-chunk buffer's, bus bandwidth and bound as nccl-tests "
        "and docs/design.md count them",
    )
    parser.add_argument("--buckets", type=int, default=64, help="overlap: buckets per measurement (default 64)")
    parser.add_argument("--bucket-size", default="25MiB", help="overlap: bucket size (default 25MiB)")
    parser.add_argument("--inflight", default="1,2,4,8", help="overlap: slices in flight to try (default 1,2,4,8)")
    parser.add_argument("--scaling-size", default="64MiB", help="scaling: all-reduce size (default 64MiB)")
    add_training_arguments(parser)
    parser.add_argument(
        "--json",
        type=Path,
        default=Path("bench-results/allreduce.json"),
        help="records file, one record per measurement (default bench-results/allreduce.json)",
    )
    parser.add_argument(
        "--plots", type=Path, default=Path("bench-results"), help="folder for PNG and SVG plots (default bench-results)"
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="have the engines write Chrome traces (FAIRRING_TIMELINE) into PLOTS/timeline-<run>/ and draw "
        "each run's last all-reduce as PLOTS/timeline-<run>.png and .svg",
    )
    # fairring.validate's --timeout is torch's, what one collective may take: this is another limit.
    _add_renamed(
        parser, "--time-limit", old="--timeout", type=float, default=900, metavar="S",
        help="seconds the whole run may take, then its ranks are stopped (default 900)",
    )  # fmt: skip
    return parser


def collective_names(text: str) -> str:
    """--collective: one of COLLECTIVES, or several, comma-separated (the workers time each in turn)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or any(name not in COLLECTIVES for name in names):
        raise argparse.ArgumentTypeError(f"{text!r}: each must be one of {', '.join(COLLECTIVES)}")
    return ",".join(names)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.loopback and (args.link or args.netns):
        parser.error("--loopback runs no hosts: it excludes --link and --netns")
    if "," in args.collective and args.study not in ("single", "compare"):
        parser.error(f"--study {args.study} times one --collective; several are for the single and compare studies")
    # Without a say in the network, the run goes where it shows what fairring is for: hosts with NICs.
    args.default_hosts, args.loopback_reason = False, ""
    if not (args.link or args.netns or args.loopback):
        args.default_hosts, args.loopback_reason = netns_available()
        args.link = DEFAULT_LINK if args.default_hosts else None
    begin, end, factor = SHAPED_SIZES if args.link else LOOPBACK_SIZES
    args.begin, args.end = args.begin or begin, args.end or end
    args.factor = factor if args.factor is None else args.factor
    if min(args.machines, args.ranks_per_machine, args.iters, args.factor - 1) < 1 or args.warmup < 0:
        parser.error("--machines, --ranks-per-machine and --iters must be >= 1, --stepfactor >= 2, --warmup_iters >= 0")
    try:
        args.size_list = size_list(args)
        args.bucket_bytes = parse_size("--bucket-size", args.bucket_size)
        args.scaling_bytes = parse_size("--scaling-size", args.scaling_size)
        args.inflight_list = [int(k) for k in args.inflight.split(",")]
        if args.link:
            parse_rate(args.link)
        if args.mtu is not None:
            check_mtu(args.mtu)
    except (ConfigError, ValueError) as error:
        parser.error(str(error))
    if min(args.inflight_list) < 1 or args.buckets < 1:
        parser.error("--inflight values and --buckets must be at least 1")
    for assignment in args.set:
        if "=" not in assignment:
            parser.error(f"--set takes VAR=VALUE, not {assignment!r}")
    args.netns = args.netns or bool(args.link)
    if args.mtu is not None and not args.netns:
        parser.error("--mtu sets the emulated hosts' NICs: it needs --link or --netns")
    if args.netns:
        available, reason = netns_available()
        if not available:
            parser.error(f"--link/--netns need network namespaces, which are unavailable here: {reason}")
    return args


def size_list(args: argparse.Namespace) -> list[int]:
    if args.sizes:
        return [parse_size("--sizes", text) for text in args.sizes.split(",")]
    begin, end = parse_size("--minbytes", args.begin), parse_size("--maxbytes", args.end)
    if begin > end:
        raise ConfigError(f"--minbytes ({args.begin}) is larger than --maxbytes ({args.end})")
    sizes = [begin]
    while sizes[-1] * args.factor <= end:
        sizes.append(sizes[-1] * args.factor)
    return sizes


def runs_for(args: argparse.Namespace) -> list[Run]:
    user_env = dict(assignment.split("=", 1) for assignment in args.set)
    studies = ("single", "overlap", "scaling") if args.study == "all" else (args.study,)
    runs = []
    if "single" in studies:
        runs.append(Run("single", args.machines, args.size_list, environment=user_env))
    if "transports" in studies:
        for transport in RAILS_TRANSPORTS:
            environment = {**user_env, RAILS_TRANSPORT: transport}
            runs.append(Run("transports", args.machines, args.size_list, environment=environment))
    if "overlap" in studies:
        from fairring import _C
        from fairring._config import load_config

        # The buckets' own slice size becomes the maximum, so that init's check
        # (staging for one full slice) asks for no more than the buckets need. This keeps the
        # buckets' slicing as it is for buckets of 2+ maximum slices (the 25 MiB default).
        max_slice = load_config({**os.environ, **user_env}).slice_size
        slice_bytes = min(args.bucket_bytes, _C.slice_bytes_for(args.bucket_bytes, max_slice))
        per_slice = _C.staging_bytes_for(slice_bytes, args.ranks_per_machine, args.machines, padded=False)
        # Init asks for room for one padded slice, which is less than two unpadded ones.
        at_least = _C.staging_bytes_for(slice_bytes, args.ranks_per_machine, args.machines, padded=True)
        for inflight in args.inflight_list:
            # Staging for exactly `inflight` slices, and the cap on slices in flight to match.
            # The study fixes the slicing itself, so the shard floor (which would grow slices and
            # warn when this deliberately small staging cannot) is off.
            environment = {
                **user_env,
                "FAIRRING_MIN_SHARD_SIZE": "0",
                "FAIRRING_SLICE_SIZE": str(slice_bytes),
                "FAIRRING_TOTAL_MEMORY": str(max(inflight * per_slice, at_least)),
                "FAIRRING_SLICES_IN_FLIGHT": str(inflight),
            }
            runs.append(Run("overlap", args.machines, [args.bucket_bytes], args.buckets, inflight, environment))
    if "scaling" in studies:
        for machines in range(1, args.machines + 1):
            runs.append(Run("scaling", machines, [args.scaling_bytes], environment=user_env))
    if "compare" in studies:
        # The engine at every size (CUDA's too), the baseline, and a group that measures afresh and routes
        # by what it decided, as FAIRRING_CUDA_ENGINE=auto does.
        environment = {**user_env, FLAT_THRESHOLD: "0", CUDA_ENGINE: "1", AUTO_CACHE: "off"}
        runs.append(Run("compare", args.machines, args.size_list, environment=environment))
    if "dispatch" in studies:
        # The engine at every size (CUDA's too) and the delegate, over the sizes auto measures,
        # next to a group that measures afresh (no cache) and routes by what it decided.
        environment = {**user_env, FLAT_THRESHOLD: "0", CUDA_ENGINE: "1", AUTO_CACHE: "off"}
        for machines, ranks in parse_layouts(args.layouts):
            sizes = list(ladder(args.collective))
            runs.append(Run("dispatch", machines, sizes, environment=environment, ranks_per_machine=ranks))
    return runs


def setup_line(args: argparse.Namespace) -> str | None:
    """What the default network setting chose, in one line; None where flags chose it."""
    if args.loopback_reason:
        return (
            f"note: network namespaces are unavailable ({args.loopback_reason}), so the machines share loopback, "
            "where the CPUs, not a network, are the bottleneck: this measures fairring's overhead, not what it is "
            "for; where they can be made (root, iproute2), each machine runs as a host with a "
            f"{format_rate(DEFAULT_LINK)} NIC."
        )
    if args.default_hosts:
        return (
            f"Each machine is a host in its own network namespace, its NIC shaped to {format_rate(DEFAULT_LINK)} both "
            "ways (--loopback: all on this host's loopback instead)."
        )
    return None


def timeline_folder(plots: Path, index: int) -> Path:
    """PLOTS/timeline-<index>, emptied of an earlier run's traces, which would mix with this run's."""
    folder = (plots / f"timeline-{index}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    from .timeline import FILE_GLOB

    for stale in folder.glob(FILE_GLOB):
        stale.unlink()
    return folder


def draw_timeline(folder: Path) -> list[str]:
    """Lines to print: the pictures of the run's last all-reduce, or why there are none."""
    from .timeline import load_events, render_op

    events = load_events([folder])
    if not events:
        with contextlib.suppress(OSError):
            folder.rmdir()  # Empty: nothing to keep.
        return [f"timeline: no trace files in {folder}; {NO_TRACES}"]
    try:
        # PLOTS/timeline-<run>.png and .svg, next to the folder of traces they were drawn from.
        return [f"timeline: {path}" for path in render_op(events, None, folder)]
    except ValueError as error:
        return [f"timeline: nothing drawn from {folder}: {error}"]


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def reading(records: list[dict], args: argparse.Namespace) -> list[str]:
    """One sentence per study, read from fairring's headline measurement in it."""
    sentences = []
    for study in ("single", "overlap", "scaling"):
        ours = [r for r in records if r["study"] == study and r["backend"].startswith("fairring")]
        if not ours:
            continue
        # The largest all-reduce, the most slices in flight, the most machines: where the network matters most.
        key = {"single": "bytes", "overlap": "inflight", "scaling": "machines"}[study]
        record = max(ours, key=lambda r: r[key] or 0)
        baseline = BASELINE_NAMES.get(record["baseline"], record["baseline"])
        size = format_bytes(record["bytes"])
        name = record.get("collective", "all_reduce")
        what = f"{record['buckets']} {name}s of {size}" if record["buckets"] > 1 else f"{name} of {size}"
        setting = {
            "single": "",
            "overlap": f" with {record['inflight']} slice(s) in flight",
            "scaling": f" on {record['machines']} machine(s)",
        }[study]
        took = f"fairring's {what}{setting} took {_duration(record['median_s'])}"
        speed = f"{record['speedup_vs_baseline']:.2f}x {baseline}'s speed"
        ranks = f"{record['ranks_per_machine']} rank{'s' if record['ranks_per_machine'] > 1 else ''}"
        layout = f"{ranks} per host" if study == "scaling" else f"{record['machines']} hosts x {ranks}"
        if record["link"]:
            bound = record["fraction_of_bound_speed"]
            of_bound = f" and {bound:.0%} of the hierarchical bound" if bound else ""
            if bound and record.get("link_busy"):
                of_bound += f" (its busiest NIC was {record['link_busy']:.0%} busy, frame headers included)"
            sentences.append(f"Over {format_rate(record['link'])} NICs ({layout}), {took}, {speed}{of_bound}.")
        elif args.netns:
            sentences.append(f"Between hosts with unshaped NICs ({layout}), {took}, {speed}.")
        else:
            sentences.append(
                f"On loopback, where the CPUs and not a network are the bottleneck, {took}, {speed}, "
                "which measures fairring's overhead rather than what it is for."
            )
    sentences += transports_reading(records)
    sentences += dispatch_reading(records)
    sentences += compare_reading(records)
    return sentences


def compare_reading(records: list[dict]) -> list[str]:
    """The compare study: a line per size, each path's time, its speed against the baseline and the bound."""
    rows = [r for r in records if r["study"] == "compare"]
    if not rows:
        return []
    lines = []
    for collective in dict.fromkeys(r.get("collective", "all_reduce") for r in rows):
        mine = [r for r in rows if r.get("collective", "all_reduce") == collective]
        sample = mine[0]
        lines.append(
            f"compare, {collective}, {sample['machines']} machines x {sample['ranks_per_machine']} "
            f"({sample['device']}{', NICs at ' + format_rate(sample['link']) if sample['link'] else ''}), the order "
            "rotated every iteration; time, speed against the baseline, fraction of the hierarchical bound:"
        )
        for nbytes in sorted({r["bytes"] for r in mine}):
            parts = []
            for record in (r for r in mine if r["bytes"] == nbytes):
                bound = record["fraction_of_bound_speed"]
                parts.append(
                    f"{record['backend']} {_duration(record['median_s'])} ({record['speedup_vs_baseline']:.2f}x"
                    f"{f', {bound:.0%}' if bound else ''}{'' if record['correct'] else ', WRONG'})"
                )
            lines.append(f"  {format_bytes(nbytes)}: " + "; ".join(parts))
    return lines


def dispatch_reading(records: list[dict]) -> list[str]:
    """Per layout: both paths' sweep, what auto chose, and whether it is where the sweep crosses over."""
    lines = []
    layouts = sorted({(r["machines"], r["ranks_per_machine"]) for r in records if r["study"] == "dispatch"})
    for machines, ranks in layouts:
        rows = [
            r
            for r in records
            if r["study"] == "dispatch" and (r["machines"], r["ranks_per_machine"]) == (machines, ranks)
        ]
        by = {(r["backend"], r["bytes"]): r for r in rows}
        auto = next(r for r in rows if "auto_threshold" in r)
        baseline = auto["baseline"]
        sizes = sorted({r["bytes"] for r in rows})
        engine = next(r for r in rows if r["backend"].startswith("fairring") and "auto_threshold" not in r)["backend"]
        sweep = [SizeTiming(n, by[(engine, n)]["median_s"], by[(baseline, n)]["median_s"]) for n in sizes]
        crossover, chosen = choose_sizes(sweep), (auto["auto_threshold"], auto["auto_ceiling"])
        took_s = f"{auto['auto_measure_s']:.1f} s"
        lines.append(
            f"dispatch, {machines} machines x {ranks}: auto measured for {took_s} and chose: {auto['auto_reason']}"
        )
        # What auto itself measured (the median of 3 of each, after one untimed), by size.
        measured = {size["bytes"]: size for size in auto["auto_sizes"]}
        lines.append(
            f"  {'size':>8} {'engine ms':>10} {baseline + ' ms':>10} {'auto ms':>10}  auto took"
            f"  (auto measured: engine ms, {baseline} ms)"
        )
        for timing in sweep:
            took = "engine" if chosen[0] <= timing.nbytes < chosen[1] else baseline
            seen = measured.get(timing.nbytes)
            seen_text = f"{seen['engine_s'] * 1e3:.3f}, {seen['delegate_s'] * 1e3:.3f}" if seen else "not measured"
            lines.append(
                f"  {format_bytes(timing.nbytes):>8} {timing.engine_s * 1e3:>10.3f} {timing.delegate_s * 1e3:>10.3f} "
                f"{by[(auto['backend'], timing.nbytes)]['median_s'] * 1e3:>10.3f}  {took:<9} ({seen_text})"
            )
        verdicts = f"this sweep's own choice: {_sizes_text(*crossover)}; auto's: {_sizes_text(*chosen)}"
        steps = ladder(auto.get("collective", "all_reduce"))
        lines.append(f"  {verdicts}; {_steps_apart(crossover, chosen, steps)}")
    return lines


def _sizes_text(threshold: int, ceiling: int) -> str:
    if threshold == ENGINE_OFF_THRESHOLD:
        return "the baseline at every size"
    below = "" if ceiling == NO_CEILING else f" to below {format_bytes(ceiling)}"
    return f"the engine from {format_bytes(threshold)}{below}"


def _steps_apart(crossover: tuple[int, int], chosen: tuple[int, int], sizes: tuple[int, ...]) -> str:
    """How many of the ladder's sizes the two choices' bounds are apart, at most ("none" one past the largest)."""
    steps = [*sizes, ENGINE_OFF_THRESHOLD]
    apart = max(abs(steps.index(ours) - steps.index(theirs)) for ours, theirs in zip(crossover, chosen, strict=True))
    return "the same" if apart == 0 else f"{apart} size step{'s' if apart > 1 else ''} apart"


def transports_reading(records: list[dict]) -> list[str]:
    """The transports study's largest all-reduce, over each transport, against the baseline of its run."""
    ours = [r for r in records if r["study"] == "transports" and r["backend"].startswith("fairring")]
    if not ours:
        return []
    largest = max(r["bytes"] for r in ours)
    parts = []
    for record in sorted((r for r in ours if r["bytes"] == largest), key=lambda r: r["backend"]):
        bound = record["fraction_of_bound_speed"]
        of_bound = f", {bound:.0%} of the bound" if bound else ""
        parts.append(
            f"over {record['rails']} {_duration(record['median_s'])} ({record['speedup_vs_baseline']:.2f}x "
            f"{record['baseline']}{of_bound}, cores {record['cpu_busy']:.0%} busy)"
        )
    size = format_bytes(largest)
    return [f"A {size} all_reduce took " + "; ".join(parts) + "."]


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def missing_plot_packages() -> list[str]:
    return [name for name in PLOT_PACKAGES if importlib.util.find_spec(name) is None]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    missing = missing_plot_packages()
    if missing:
        print(
            f"fairring.bench: the plots need {' and '.join(missing)}, not installed in this Python: "
            "pip install 'torch-fairring[bench]' (from a checkout: pip install --no-build-isolation '.[bench]')",
            file=sys.stderr,
        )
        return 2
    # Terminated (kill, a scheduler's time limit), the run still stops its ranks and removes its
    # hosts: SystemExit unwinds through run_agents' `finally` and the cluster's `with`.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    if args.study == "training":
        return run_training_study(args, argv)
    line = setup_line(args)
    if line:
        print(line, flush=True)
    records: list[dict] = []
    environment: dict = {}
    pictures: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, run in enumerate(runs_for(args)):
            print(f"== {run.describe()}", flush=True)
            output = Path(scratch) / f"run{index}.json"
            folder = timeline_folder(args.plots, index) if args.timeline else None
            extra = {"FAIRRING_TIMELINE": str(folder)} if folder else {}
            with hosts_for(args, run.machines) as hosts:
                status = run_agents(args, run, hosts, output, extra)
            if status != 0:
                return status
            result = json.loads(output.read_text())
            environment = result["environment"]
            records += result["records"]
            if folder:
                pictures += draw_timeline(folder)
    command = ["python", "-m", "fairring.bench", *argv]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"command": command, "environment": environment, "records": records}, indent=1))
    print(f"records: {args.json}")
    from .plots import plot_records

    for path in plot_records(records, args.plots, title_suffix=f", NICs at {args.link}" if args.link else ""):
        print(f"plot: {path}")
    for picture in pictures:
        print(picture)
    for sentence in reading(records, args):
        print(sentence)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
