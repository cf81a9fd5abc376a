"""Timelines of fairring's engine, drawn from the Chrome-trace files it writes.

With FAIRRING_TIMELINE=DIR, each rank's engine writes
DIR/fairring-<group>-rank<R>-<device>.json, one complete event ("ph": "X") per
stage of each slice: "reduce-scatter" (staging lease, local reduce-scatter,
shards out on the rails), "reduce" (the received shards reduced and sent back)
and "all-gather" (into the caller's tensor). This draws one all-reduce as a
Gantt chart, one row per rank and stage and one bar per slice, so that the
stages of consecutive slices are seen to overlap:

    python -m fairring.bench.timeline DIR               # the last op every rank finished
    python -m fairring.bench.timeline DIR --op 3 -o op3
    python -m fairring.bench.timeline DIR --merged all.json   # one trace for Perfetto or chrome://tracing

It also prints, per stage, what the op's slices spent in it: the median per slice and the
stage's occupancy (the time some slice was in it, over the op's span, on the median rank). A
stage near 100% paces the pipeline; the reduce-scatter's time includes waiting for staging.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path

from fairring._sizes import format_size

__all__ = [
    "default_op",
    "engine_slices",
    "load_events",
    "main",
    "merge_traces",
    "parse_trace",
    "render_op",
    "stage_profile",
]

STAGES = ("reduce-scatter", "reduce", "all-gather")
FILE_GLOB = "fairring-*.json"
FILE_NAME = re.compile(r"fairring-(?P<group>.+)-rank(?P<rank>\d+)-(?P<device>[^-]+)\.json")
# load_events records which file (group and device) each event came from under this key, since the
# events themselves name only the rank; merge_traces drops it again.
ENGINE = "_engine"
# Qualitative, so that neighbouring slices get clearly different colors: tab20's dark shades, then its
# light ones (it pairs them, dark then light, which would make neighbours look alike).
COLORMAP = "tab20"


def parse_trace(text: str, source: str = "<trace>") -> list[dict]:
    """The events of a trace in JSON Array Format (closing ']' optional) or JSON Object Format."""
    body = text.strip()
    if not body:
        return []
    if body.startswith("{"):
        events = json.loads(body).get("traceEvents", [])
    else:
        # A writer that has not closed the array (still running, or killed) leaves a trailing comma
        # and no ']'; Chrome accepts that, so this does too.
        body = body.removesuffix("]").rstrip().rstrip(",")
        try:
            events = json.loads(body + "]")
        except json.JSONDecodeError:
            events = _parse_lines(body, source)
    return [event for event in events if isinstance(event, dict)]


def _parse_lines(body: str, source: str) -> list[object]:
    """One event per line; a cut-off last line (a writer killed mid-write) is dropped."""
    lines = [(number, line.strip().rstrip(",")) for number, line in enumerate(body.splitlines(), 1)]
    lines = [(number, line) for number, line in lines if line and line != "["]
    if lines and lines[0][1].startswith("["):
        lines[0] = (lines[0][0], lines[0][1][1:])
    events = []
    for index, (number, line) in enumerate(lines):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as error:
            if index == len(lines) - 1:
                break
            raise ValueError(f"{source}:{number}: not a trace event ({error.msg}): {line[:80]}") from None
    return events


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(path.glob(FILE_GLOB))
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"no such trace file or folder: {path}")
    return files


def load_events(paths: Iterable[str | Path]) -> list[dict]:
    """Every event of the given trace files, and of the fairring-*.json files in the given folders."""
    events = []
    for file in trace_files(paths):
        match = FILE_NAME.fullmatch(file.name)
        engine = f"{match['group']}/{match['device']}" if match else file.stem
        for event in parse_trace(file.read_text(), str(file)):
            events.append({**event, ENGINE: event.get(ENGINE, engine)})
    return events


def _slices(events: Iterable[dict]) -> list[dict]:
    """The complete events of slices: those that name their op and slice."""
    chosen = []
    for event in events:
        args = event.get("args")
        if event.get("ph") == "X" and isinstance(args, dict) and isinstance(args.get("op"), int):
            chosen.append(event)
    return chosen


def engine_slices(events: list[dict], engine: str | None = None) -> tuple[str | None, list[dict]]:
    """(engine, its slice events): `engine` ("GROUP/DEVICE"), or by default the one with the most events."""
    counts: dict[str | None, int] = {}
    for event in _slices(events):
        counts[event.get(ENGINE)] = counts.get(event.get(ENGINE), 0) + 1
    if not counts:
        raise ValueError("the traces hold no slice events")
    if engine is None:
        # Where several groups each have an engine on every rank, the busiest is the one worth a look.
        engine = max(counts, key=lambda key: (counts[key], str(key)))
    elif engine not in counts:
        raise ValueError(f"no events of engine {engine!r}; there are {', '.join(sorted(map(str, counts)))}")
    return engine, [event for event in _slices(events) if event.get(ENGINE) == engine]


def default_op(slices: list[dict]) -> int:
    """The highest op number that every rank has events of: the last op all ranks got to."""
    ops_by_rank: dict[int, set[int]] = {}
    for event in slices:
        ops_by_rank.setdefault(event["pid"], set()).add(event["args"]["op"])
    common = set.intersection(*ops_by_rank.values()) if ops_by_rank else set()
    if not common:
        raise ValueError("no op has events on every rank")
    return max(common)


def _stage_order(events: list[dict], slices: list[dict]) -> list[str]:
    # The engine names its threads; order rows by thread id, then known stages, then the rest.
    tids = {e["args"]["name"]: e.get("tid", 0) for e in events if e.get("name") == "thread_name" and "args" in e}
    for event in slices:
        tids.setdefault(event["name"], event.get("tid", len(STAGES)))
    known = {stage: index for index, stage in enumerate(STAGES)}
    present = {event["name"] for event in slices}
    return sorted(present, key=lambda name: (tids.get(name, 0), known.get(name, len(STAGES)), name))


def _covered_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered


def stage_profile(slices: list[dict], op: int) -> list[dict]:
    """Per stage of op `op`: slices, median ms per slice, and occupancy of the op's span.

    Each figure is the median over ranks, so one descheduled rank does not set it.
    """
    chosen = [event for event in slices if event["args"]["op"] == op]
    if not chosen:
        raise ValueError(f"no events of op {op}")
    by_rank: dict[int, list[dict]] = {}
    for event in chosen:
        by_rank.setdefault(event["pid"], []).append(event)
    rows = []
    for stage in _stage_order([], chosen):
        per_slice_ms, occupancy, counts = [], [], []
        for events in by_rank.values():
            span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
            mine = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == stage]
            if not mine or span <= 0:
                continue
            counts.append(len(mine))
            per_slice_ms.append(statistics.median(end - start for start, end in mine) / 1e3)
            occupancy.append(_covered_us(mine) / span)
        if counts:
            rows.append(
                {
                    "stage": stage,
                    "slices": int(statistics.median(counts)),
                    "median_ms_per_slice": statistics.median(per_slice_ms),
                    "occupancy": statistics.median(occupancy),
                }
            )
    return rows


def _machines(events: list[dict]) -> dict[int, int]:
    """Rank -> machine, from the process names ("rank R (machine m, local rank l)") where given."""
    machines = {}
    for event in events:
        if event.get("ph") == "M" and event.get("name") == "process_name":
            match = re.search(r"machine (\d+)", str(event.get("args", {}).get("name", "")))
            if match:
                machines[event["pid"]] = int(match.group(1))
    return machines


def render_op(events: list[dict], op: int | None, out_stem: Path, engine: str | None = None) -> list[Path]:
    """Draws op `op` (default: the last one on every rank) as a Gantt chart; writes <out_stem>.png and .svg."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engine, slices = engine_slices(events, engine)
    events = [event for event in events if event.get(ENGINE) == engine]
    if op is None:
        op = default_op(slices)
    slices = [event for event in slices if event["args"]["op"] == op]
    if not slices:
        raise ValueError(f"no events of op {op}")
    ranks = sorted({event["pid"] for event in slices})
    stages = _stage_order(events, slices)
    machines = _machines(events)
    rows = {(rank, stage): index for index, (rank, stage) in enumerate((r, s) for r in ranks for s in stages)}
    start = min(float(event["ts"]) for event in slices)
    end_ms = max(float(event["ts"]) + float(event.get("dur", 0)) - start for event in slices) / 1e3
    # The size of the op: each slice once, from one rank.
    first = ranks[0]
    size = sum({e["args"]["slice"]: int(e["args"].get("bytes", 0)) for e in slices if e["pid"] == first}.values())

    figure, axes = plt.subplots(figsize=(11, 1.4 + 0.32 * len(rows)))
    shades = plt.get_cmap(COLORMAP).colors  # type: ignore[attr-defined]
    colors = [*shades[0::2], *shades[1::2]]
    axes.set_xlim(0, end_ms * 1.01 or 1.0)
    # Points per ms on the x axis, to tell where a bar is wide enough for its slice number.
    points_per_ms = figure.get_figwidth() * 72 * axes.get_position().width / (end_ms * 1.01 or 1.0)
    for event in slices:
        left, width = (float(event["ts"]) - start) / 1e3, float(event.get("dur", 0)) / 1e3
        number = int(event["args"].get("slice", 0))
        row = rows[(event["pid"], event["name"])]
        axes.barh(row, width, left=left, height=0.8, color=colors[number % len(colors)], edgecolor="black", lw=0.3)
        label = str(number)
        if width * points_per_ms > 6 * len(label) + 4:
            axes.text(left + width / 2, row, label, ha="center", va="center", fontsize=7)
    for index in range(1, len(ranks)):
        # A thick line between machines, a thin one between ranks of one machine.
        between_machines = machines.get(ranks[index]) != machines.get(ranks[index - 1])
        axes.axhline(index * len(stages) - 0.5, color="black", lw=1.2 if between_machines else 0.4)
    axes.set_yticks(list(rows.values()))
    axes.set_yticklabels([f"rank {rank}  {stage}" for rank, stage in rows])
    axes.set_ylim(len(rows) - 0.5, -0.5)  # Rank 0's first stage on top.
    axes.set_xlabel("ms since the op's first event")
    axes.grid(True, axis="x", alpha=0.3)
    machine_count = len({machines[rank] for rank in ranks if rank in machines})
    layout = f"{machine_count} machines, {len(ranks)} ranks" if machine_count else f"{len(ranks)} ranks"
    slice_count = len({event["args"]["slice"] for event in slices if event["pid"] == first})
    where = f" [{engine}]" if engine is not None else ""
    axes.set_title(
        f"fairring all_reduce op {op}: {format_size(size)} in {slice_count} slices, {layout}{where} "
        f"({end_ms:.1f} ms; bar color and number: slice)",
        fontsize=10,
    )
    figure.tight_layout()
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for suffix in ("png", "svg"):
        path = out_stem.with_name(f"{out_stem.name}.{suffix}")
        figure.savefig(path, dpi=120)
        written.append(path)
    plt.close(figure)
    return written


def merge_traces(events: list[dict], path: Path) -> Path:
    """Writes `events` as one trace (JSON Object Format) that Perfetto and chrome://tracing open."""
    several = len({event.get(ENGINE) for event in events}) > 1
    pids: dict[tuple[str, object], int] = {}
    merged = []
    for event in events:
        copy = {key: value for key, value in event.items() if key != ENGINE}
        if several:
            # Each file numbers its process by rank, so the engines of several groups would share
            # tracks: give each engine's rank its own process, named after both.
            key = (str(event.get(ENGINE)), event.get("pid"))
            copy["pid"] = pids.setdefault(key, len(pids))
            if copy.get("ph") == "M" and copy.get("name") == "process_name":
                args = dict(copy.get("args") or {})
                args["name"] = f"{args.get('name', f'rank {key[1]}')} [{key[0]}]"
                copy["args"] = args
        merged.append(copy)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": merged, "displayTimeUnit": "ms"}))
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fairring.bench.timeline",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("paths", nargs="+", type=Path, help="trace files, or folders of fairring-*.json")
    parser.add_argument("--op", type=int, help="op number to draw (default: the last one every rank has)")
    parser.add_argument("-o", "--output", type=Path, help="picture path without suffix (default: DIR/timeline-opN)")
    parser.add_argument("--engine", help="GROUP/DEVICE of the engine to draw, where the traces hold several")
    parser.add_argument("--merged", type=Path, help="also write every event into this one Chrome-trace file")
    args = parser.parse_args(argv)
    try:
        events = load_events(args.paths)
        if not events:
            raise ValueError(f"no trace events in {', '.join(map(str, args.paths))}")
        if args.merged:
            print(merge_traces(events, args.merged))
        op = args.op if args.op is not None else default_op(engine_slices(events, args.engine)[1])
        folder = args.paths[0] if args.paths[0].is_dir() else args.paths[0].parent
        for path in render_op(events, op, args.output or folder / f"timeline-op{op}", args.engine):
            print(path)
        print(f"op {op}, median over ranks:")
        for row in stage_profile(engine_slices(events, args.engine)[1], op):
            print(
                f"  {row['stage']:>16}: {row['slices']} slices, {row['median_ms_per_slice']:.2f} ms per slice, "
                f"{row['occupancy']:.0%} of the op's span"
            )
    except (OSError, ValueError) as error:
        print(f"fairring.bench.timeline: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
