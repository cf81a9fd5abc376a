"""Plots of the training study's records: step times, and the loss curves of both backends."""

from __future__ import annotations

from pathlib import Path


def model_name(record: dict) -> str:
    """The model, and how it was parallelised where not DDP: "gpt fsdp2"."""
    parallel = record.get("parallel", "ddp")
    return record["model"] if parallel == "ddp" else f"{record['model']} {parallel}"


def _label(record: dict) -> str:
    network = record["link"] or "loopback"
    return f"{model_name(record)}\n{record['machines']}x{record['ranks_per_machine']}, {network}"


def plot_training(records: list[dict], folder: Path) -> list[Path]:
    """training-steps (median step time, min-max bars) and training-losses (real compute); the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for part in ("real", "emulated"):
        chosen = [r for r in records if r["part"] == part]
        if not chosen:
            continue
        labels = list(dict.fromkeys(_label(r) for r in chosen))
        backends = list(dict.fromkeys(r["backend"] for r in chosen))
        figure, axes = plt.subplots(figsize=(max(6.4, 1.3 * len(labels)), 4.4))
        width = 0.8 / len(backends)
        for index, backend in enumerate(backends):
            mine = {_label(r): r for r in chosen if r["backend"] == backend}
            xs = [i + index * width for i, label in enumerate(labels) if label in mine]
            medians = [mine[label]["median_s"] for label in labels if label in mine]
            low = [mine[label]["median_s"] - mine[label]["min_s"] for label in labels if label in mine]
            high = [mine[label]["max_s"] - mine[label]["median_s"] for label in labels if label in mine]
            axes.bar(xs, medians, width, yerr=[low, high], capsize=3, label=backend)
        axes.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels, fontsize=7)
        axes.set_ylabel("time per training step (s)")
        axes.set_title(f"training, {part} compute: median step, min-max bars")
        axes.legend()
        figure.tight_layout()
        written += _save(figure, folder / f"training-steps-{part}", plt)
    real = [r for r in records if r["part"] == "real"]
    if real:
        figure, axes = plt.subplots(figsize=(6.4, 4.2))
        for record in real:
            style = "-" if record["backend"] == "fairring" else ":"
            label = f"{model_name(record)} {record['link'] or 'loopback'} {record['backend']}"
            axes.plot(range(len(record["losses"])), record["losses"], style, label=label)
        axes.set_xlabel("step")
        axes.set_ylabel("rank 0's loss")
        axes.set_title("real compute: losses of both backends (they must overlap)")
        axes.legend(fontsize=6)
        figure.tight_layout()
        written += _save(figure, folder / "training-losses", plt)
    return written


def _save(figure: object, stem: Path, plt: object) -> list[Path]:
    paths = [stem.with_suffix(f".{suffix}") for suffix in ("png", "svg")]
    for path in paths:
        figure.savefig(path)  # type: ignore[attr-defined]
    plt.close(figure)  # type: ignore[attr-defined]
    return paths
