"""fairring.bench.timeline: tolerant parsing of the engine's Chrome traces, and the pictures drawn from them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

from fairring.bench import timeline
from fairring.bench.timeline import default_op, engine_slices, load_events, parse_trace, render_op

STAGES = ("reduce-scatter", "reduce", "all-gather")
SLICE_BYTES = 1 << 20


def trace_lines(rank: int, ops: int, slices: int) -> list[str]:
    """The lines the engine writes for `ops` all-reduces of `slices` slices on `rank` (2 machines x 2 ranks)."""
    name = f"rank {rank} (machine {rank // 2}, local rank {rank % 2})"
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": name}}]
    for tid, stage in enumerate(STAGES):
        events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": stage}})
    for op in range(ops):
        for index in range(slices):
            for tid, stage in enumerate(STAGES):
                # Slice k+1 reduce-scatters while slice k reduces: stage t of slice k starts at k + t.
                ts = 1.7e15 + op * 1e5 + (index + tid) * 1000.0 + rank * 10
                args = {"op": op, "slice": index, "bytes": SLICE_BYTES}
                event = {"name": stage, "cat": "fairring", "ph": "X", "ts": ts, "dur": 900.0}
                events.append({**event, "pid": rank, "tid": tid, "args": args})
    return ["["] + [json.dumps(event) + "," for event in events]


def write_trace(folder: Path, rank: int, ops: int, slices: int = 4, closed: bool = True) -> Path:
    path = folder / f"fairring-0-rank{rank}-cpu.json"
    path.write_text("\n".join(trace_lines(rank, ops, slices) + (["]"] if closed else [])) + "\n")
    return path


@pytest.mark.timeout(60)
def test_load_events_accepts_unclosed_and_cut_off_arrays(tmp_path: Path) -> None:
    write_trace(tmp_path, 0, ops=2)
    write_trace(tmp_path, 1, ops=2, closed=False)
    # A writer killed mid-line: the cut-off event is dropped, the rest kept.
    cut = tmp_path / "fairring-0-rank2-cpu.json"
    cut.write_text("\n".join(trace_lines(2, ops=2, slices=4)) + '\n{"name": "reduce", "ph": "X", "ts": 12')
    (tmp_path / "unrelated.json").write_text("not a trace")
    events = load_events([tmp_path])
    per_file = 4 + 2 * 4 * 3  # Metadata, then ops x slices x stages.
    assert len(events) == 3 * per_file
    assert {event["pid"] for event in events} == {0, 1, 2}
    assert {event[timeline.ENGINE] for event in events} == {"0/cpu"}
    assert load_events([cut]) == [event for event in events if event["pid"] == 2]
    assert parse_trace("") == [] and parse_trace("[\n") == []
    assert parse_trace('{"traceEvents": [{"ph": "X"}]}') == [{"ph": "X"}]
    with pytest.raises(ValueError, match=r"x\.json:2"):
        parse_trace('[\n{"broken",\n{"ph": "X"},\n', "x.json")
    with pytest.raises(FileNotFoundError):
        load_events([tmp_path / "missing"])


@pytest.mark.timeout(60)
def test_render_op_draws_the_last_op_every_rank_has(tmp_path: Path) -> None:
    for rank in range(4):
        # Rank 3 is still writing op 3: the last op every rank has is 2.
        write_trace(tmp_path, rank, ops=4 if rank < 3 else 3, closed=rank != 3)
    events = load_events([tmp_path])
    assert default_op(engine_slices(events)[1]) == 2
    # Text as text in the SVG, to read the title back.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        written = render_op(events, None, tmp_path / "pictures" / "op")
    assert written == [tmp_path / "pictures" / "op.png", tmp_path / "pictures" / "op.svg"]
    assert all(path.stat().st_size > 0 for path in written)
    assert written[0].read_bytes().startswith(b"\x89PNG")
    svg = written[1].read_text()
    assert "op 2: 4MiB in 4 slices, 2 machines, 4 ranks" in svg
    assert "rank 3  all-gather" in svg
    render_op(events, 0, tmp_path / "op0")
    assert (tmp_path / "op0.png").stat().st_size > 0
    with pytest.raises(ValueError, match="op 7"):
        render_op(events, 7, tmp_path / "none")


@pytest.mark.timeout(60)
def test_cli_draws_and_merges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in range(2):
        write_trace(traces, rank, ops=3, slices=2, closed=False)
    merged = tmp_path / "merged.json"
    assert timeline.main([str(traces), "--merged", str(merged)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[:3] == [str(merged), str(traces / "timeline-op2.png"), str(traces / "timeline-op2.svg")]
    assert printed[3] == "op 2, median over ranks:"
    assert printed[4].split() == [
        "reduce-scatter:",
        "2",
        "slices,",
        "0.90",
        "ms",
        "per",
        "slice,",
        "46%",
        "of",
        "the",
        "op's",
        "span",
    ]
    events = json.loads(merged.read_text())["traceEvents"]
    assert len(events) == 2 * (4 + 3 * 2 * 3)
    assert all(timeline.ENGINE not in event for event in events)
    assert timeline.main([str(tmp_path / "merged.json"), "--op", "0", "-o", str(tmp_path / "first")]) == 0
    assert (tmp_path / "first.svg").stat().st_size > 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert timeline.main([str(empty)]) == 1
    assert "no trace events" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_stage_profile_reports_each_stage_per_slice_and_its_occupancy(tmp_path: Path) -> None:
    for rank in range(4):
        write_trace(tmp_path, rank, ops=2, slices=4)
    _, slices = engine_slices(load_events([tmp_path]))
    rows = timeline.stage_profile(slices, op=1)
    # Each stage holds each of 4 slices for 0.9 ms, back to back 1 ms apart; the op spans stage 0
    # of slice 0 to stage 2 of slice 3: (3 + 2) ms + 0.9 ms.
    assert [row["stage"] for row in rows] == list(STAGES)
    for row in rows:
        assert row["slices"] == 4
        assert row["median_ms_per_slice"] == pytest.approx(0.9)
        assert row["occupancy"] == pytest.approx(4 * 0.9 / 5.9)
    with pytest.raises(ValueError, match="op 7"):
        timeline.stage_profile(slices, op=7)


@pytest.mark.timeout(60)
def test_covered_time_merges_overlapping_intervals() -> None:
    assert timeline._covered_us([(0, 2), (1, 3), (5, 6)]) == 4
    assert timeline._covered_us([(5, 6), (0, 10)]) == 10
    assert timeline._covered_us([]) == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", [[], ["--emulated"]], ids=["cpu", "emulated_launching_ahead"])
def test_the_op_breakdown_finds_every_stage_of_an_op(device: list[str]) -> None:
    """benchmarks/op_breakdown.py (make op-breakdown) reads the timeline's spans back per op: every stage of
    a small all-gather has a start and an end after its issue (a span it failed to match prints nan)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "op_breakdown.py"
    arguments = ["--collective", "all_gather", "--sizes", "64KiB", "--iters", "3", "--warmup", "1", *device]
    result = subprocess.run([sys.executable, str(script), *arguments], capture_output=True, text=True, timeout=110)
    assert result.returncode == 0, result.stderr[-2000:]
    row = next(line for line in result.stdout.splitlines() if line.strip().startswith("64KiB"))
    spans = re.findall(r"(\d+\.\d+|nan)-\s*(\d+\.\d+|nan)", row)
    assert len(spans) == 3 and "nan" not in row, row
    assert all(float(start) <= float(end) for start, end in spans), row
