"""Plots of benchmark records: one figure per study, as PNG and SVG."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

MiB = 1 << 20


def _collective(record: dict) -> str:
    return record.get("collective") or "all_reduce"


def _series(records: list[dict], key: str) -> dict[str, list[tuple[float, float]]]:
    """(x, median seconds) points by backend (and collective, where there are several), sorted by x."""
    several = len({_collective(r) for r in records}) > 1
    series: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        label = f"{_collective(record)}: {record['backend']}" if several else record["backend"]
        series.setdefault(label, []).append((float(record[key]), float(record["median_s"])))
    return {label: sorted(points) for label, points in series.items()}


def _bound_points(records: Iterable[dict], key: str) -> dict[str, list[tuple[float, float]]]:
    """The hierarchical bound's points, by collective."""
    bounds: dict[str, dict[float, float]] = {}
    for record in records:
        if record.get("bound_s"):
            bounds.setdefault(_collective(record), {})[float(record[key])] = float(record["bound_s"])
    return {collective: sorted(points.items()) for collective, points in bounds.items()}


def plot_records(records: list[dict], folder: Path, title_suffix: str = "") -> list[Path]:
    """Writes a figure per study present in `records`; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    studies = {
        "single": ("bytes", "all-reduce size (MiB)", 1 / MiB, True, "time per all-reduce"),
        "compare": ("bytes", "all-reduce size (MiB)", 1 / MiB, True, "time per all-reduce"),
        "overlap": ("inflight", "slices in flight (staging memory)", 1.0, False, "time for all buckets"),
        "scaling": ("machines", "machines", 1.0, False, "time per all-reduce"),
    }
    written: list[Path] = []
    folder.mkdir(parents=True, exist_ok=True)
    for study, (key, xlabel, scale, logscale, ylabel) in studies.items():
        chosen = [r for r in records if r["study"] == study and r.get(key) is not None]
        if not chosen:
            continue
        figure, axes = plt.subplots(figsize=(6.4, 4.2))
        for backend, points in _series(chosen, key).items():
            axes.plot([x * scale for x, _ in points], [t for _, t in points], marker="o", label=backend)
        bounds = _bound_points(chosen, key)
        for collective, bound in bounds.items():
            label = "hierarchical bound" + (f" ({collective})" if len(bounds) > 1 else "")
            axes.plot([x * scale for x, _ in bound], [t for _, t in bound], "k--", label=label)
        if logscale:
            axes.set_xscale("log")
            axes.set_yscale("log")
        else:
            axes.set_xticks(sorted({float(r[key]) * scale for r in chosen}))  # the values measured, no fractions
        sample = chosen[0]
        machines = "" if study == "scaling" else f"{sample['machines']} machines x "
        axes.set_title(f"{study}: {machines}{sample['ranks_per_machine']} ranks, {sample['device']}{title_suffix}")
        axes.set_xlabel(xlabel)
        axes.set_ylabel(f"{ylabel} (s)")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
        figure.tight_layout()
        for suffix in ("png", "svg"):
            path = folder / f"{study}.{suffix}"
            figure.savefig(path)
            written.append(path)
        plt.close(figure)
    return written
