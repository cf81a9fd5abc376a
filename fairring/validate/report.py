"""What rank 0 prints and writes: nccl-tests' tables, the comparison, the rails and the verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fairring._sizes import format_size
from fairring.bench.collectives import COLLECTIVES

from .network import Bound
from .sweep import ENGINE, ENGINE_OFF, Row

# nccl-tests' columns: name, unit, width.
COLUMNS = (
    ("size", "(B)", 12),
    ("count", "(elements)", 12),
    ("type", "", 8),
    ("redop", "", 6),
    ("root", "", 6),
    ("time", "(us)", 10),
    ("algbw", "(GB/s)", 8),
    ("busbw", "(GB/s)", 8),
    ("#wrong", "", 8),
)


def row_record(row: Row, world_size: int, collective: str = "all_reduce") -> dict[str, Any]:
    """nccl-tests' busbw: algbw x 2(n-1)/n for an all-reduce, (n-1)/n for the other two (bench.collectives)."""
    algbw = row.nbytes / row.median_s / 1e9
    return {
        "bytes": row.nbytes,
        "count": row.count,
        "time_us": row.median_s * 1e6,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * COLLECTIVES[collective].bus_factor(world_size),
        "wrong": row.wrong,
    }


def _line(cells: list[str]) -> str:
    return " ".join(f"{cell:>{width}}" for cell, (_, _, width) in zip(cells, COLUMNS, strict=True))


def path_table(
    name: str, records: list[dict[str, Any]], type_name: str, redop: str = "sum", placement: str = "in place"
) -> list[str]:
    """One path's results in nccl-tests' layout, in place or out of place (one column set either way)."""
    lines = [f"# {name}, {placement}", "#" + _line([column for column, _, _ in COLUMNS])[1:]]
    lines.append("#" + _line([unit for _, unit, _ in COLUMNS])[1:])
    for record in records:
        cells = [str(record["bytes"]), str(record["count"]), type_name, redop, "-1", f"{record['time_us']:.2f}"]
        cells += [f"{record['algbw_GBps']:.3f}", f"{record['busbw_GBps']:.3f}", str(record["wrong"])]
        lines.append(_line(cells))
    average = sum(record["busbw_GBps"] for record in records) / len(records)
    wrong = sum(record["wrong"] for record in records)
    lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    return [*lines, f"# Avg bus bandwidth    : {average:.3f}", "#"]


def comparison(
    results: dict[str, list[dict[str, Any]]],
    delegate: str,
    bound: Bound,
    num_machines: int,
    collective: str = "all_reduce",
) -> list[dict[str, Any]]:
    """Per size: the engine's speed relative to the delegate (its time / the engine's) and its share of the bound."""
    rows = []
    for index, engine in enumerate(results[ENGINE]):
        other = results[delegate][index]
        bound_s = bound.seconds(engine["bytes"], num_machines, collective)
        rows.append({
            "bytes": engine["bytes"],
            "engine_vs_delegate": other["time_us"] / engine["time_us"],
            "bound_us": bound_s * 1e6 if bound_s is not None else None,
            "of_bound": bound_s * 1e6 / engine["time_us"] if bound_s is not None else None,
            "delegate_of_bound": bound_s * 1e6 / other["time_us"] if bound_s is not None else None,
        })  # fmt: skip
    return rows


def _cell(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def comparison_table(
    rows: list[dict[str, Any]], results: dict[str, list[dict[str, Any]]], delegate: str, bound_note: str
) -> list[str]:
    names = [ENGINE, delegate, *([ENGINE_OFF] if ENGINE_OFF in results else [])]
    header = ["size(B)", *(f"{name}(us)" for name in names), f"vs {delegate}", "bound(us)", "of bound"]
    header.append(f"{delegate} of bound")
    widths = [max(12, len(cell)) for cell in header]
    lines = [f"# fairring's engine against {delegate}, and against the hierarchical bound: {bound_note}"]
    lines.append("#" + " ".join(f"{cell:>{width}}" for cell, width in zip(header, widths, strict=True))[1:])
    for index, row in enumerate(rows):
        cells = [str(row["bytes"]), *(f"{results[name][index]['time_us']:.2f}" for name in names)]
        cells += [f"{row['engine_vs_delegate']:.2f}x", _cell(row["bound_us"], ".2f")]
        cells += [_percent(row["of_bound"]), _percent(row["delegate_of_bound"])]
        lines.append(" ".join(f"{cell:>{width}}" for cell, width in zip(cells, widths, strict=True)))
    return [*lines, "#"]


@dataclass(frozen=True)
class Verdict:
    engine_wins: bool
    from_bytes: int | None  # the smallest size from which the engine is faster at every larger size
    flat_threshold: str | None  # what to set FAIRRING_FLAT_THRESHOLD to
    text: str


def _keep_delegate(device_type: str, delegate: str) -> str:
    if device_type == "cuda":
        return f"keep {delegate} (the engine off: leave FAIRRING_CUDA_ENGINE unset, its default)"
    return f"keep {delegate} (the engine off: fairring.Options(engine=False), or a {delegate} group)"


def verdict(
    sizes: list[int], engine_us: list[float], delegate_us: list[float], device_type: str, delegate: str, wrong: int
) -> Verdict:
    """Whether the engine wins here, and from which size: the smallest from which it is faster at every larger size."""
    if wrong:
        text = (
            f"{wrong} wrong element(s): results on this cluster are wrong, so no speed counts; "
            f"{_keep_delegate(device_type, delegate)} and report this output."
        )
        return Verdict(False, None, None, text)
    wins = [engine < other for engine, other in zip(engine_us, delegate_us, strict=True)]
    if not wins[-1]:
        text = (
            f"fairring's engine was not faster than {delegate} at the largest size, {format_size(sizes[-1])}: "
            f"{_keep_delegate(device_type, delegate)}."
        )
        return Verdict(False, None, None, text)
    first = len(wins) - 1
    while first > 0 and wins[first - 1]:
        first -= 1
    threshold = format_size(sizes[first])
    engine_on = "FAIRRING_CUDA_ENGINE=1 and " if device_type == "cuda" else ""
    text = (
        f"fairring's engine wins on this cluster from {threshold} (faster than {delegate} at every size from there "
        f"to {format_size(sizes[-1])}): set {engine_on}FAIRRING_FLAT_THRESHOLD={threshold} on every rank."
    )
    if first == 0:
        text += " It won at every size measured; to find where it stops winning, sweep smaller sizes (-b)."
    return Verdict(True, sizes[first], threshold, text)


def rails_lines(groups: list[dict[str, Any]], chosen_late: bool) -> list[str]:
    when = "chosen by the engine's first all-reduce" if chosen_late else "as chosen when the group was made"
    lines = [f"# Rails of fairring's engine group ({when}):"]
    for entry in groups:
        ranks = ",".join(str(rank) for rank in entry["ranks"])
        hosts = f"{len(entry['hosts'])} host(s)"
        if entry["transport"] == "nixl":
            carried = f"NIXL {entry['nixl_backend']}; " + (
                " ".join(f"{k}={v}" for k, v in entry["ucx"].items()) or "no UCX_* variable set"
            )
        else:
            carried = (
                f"TensorPipe: transports {','.join(entry['tensorpipe_transports']) or '-'}; "
                f"CPU channels {','.join(entry['cpu_channels']) or '-'}; "
                f"CUDA channels {','.join(entry['cuda_channels']) or '-'}"
            )
        gdr = "yes" + (f" ({','.join(entry['gpu_direct_nics'])})" if entry["gpu_direct_nics"] else "")
        lines.append(
            f"#  ranks {ranks} ({hosts}): {entry['interface']}; {carried}; "
            f"GPUDirect RDMA: {gdr if entry['gpu_direct_rdma'] else 'no'}"
        )
    return [*lines, "#"]


def bound_note(bound: Bound, num_machines: int, collective: str = "all_reduce") -> str:
    if num_machines < 2:
        return "one machine: nothing crosses a NIC, so there is no bound"
    if bound.bytes_per_s is None:
        return f"unknown ({bound.why_unknown})"
    gbps = bound.bytes_per_s * 8 / 1e9
    passes = "2" if COLLECTIVES[collective].passes == 2 else ""
    return f"{passes}(M-1)/M x S / NIC rate, M = {num_machines}, NIC rate {gbps:g} Gbit/s per machine ({bound.source})"
