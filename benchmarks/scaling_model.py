"""Calibrate fairring's cost model on bench records, and predict it at GPU-cluster scale.

    python benchmarks/scaling_model.py --records docs/benchmarks/*.json docs/benchmarks/slice-sweep/*.json \\
        --out docs/benchmarks/model
    python benchmarks/scaling_model.py --predict-only [--params docs/benchmarks/model/model.json] --out DIR

The model is fairring/bench/model.py (docs/model.md). For every link setting among the records
(a tc rate such as 1gbit, or loopback) the command fits the model's free parameters to the
records' medians, prints them and a residual per record, then predicts a GPU cluster
(8 GPUs per machine, 1 to 128 machines) and writes plots (PNG and SVG) and model.json to --out.
--predict-only fits nothing: it uses --params (a model.json written before) or the defaults.
It needs neither torch nor the C++ extension.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from fairring._config import DEFAULT_MIN_SHARD_SIZE
from fairring._sizes import GiB, MiB, format_bytes, parse_size
from fairring.bench import model

MACHINES = [1, 2, 4, 8, 16, 32, 64, 128]
BUCKET = 25 * MiB  # DDP's default bucket
BUCKETS = 64  # back to back, as the original fairring's scaling study ran them


def _size(raw: str) -> int:
    return parse_size("size", raw)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", nargs="*", default=[], type=Path, help="bench JSON files")
    parser.add_argument("--out", type=Path, default=Path("bench-results/model"), help="folder for plots and JSON")
    parser.add_argument("--predict-only", action="store_true", help="fit nothing: use --params or the defaults")
    parser.add_argument("--params", type=Path, help="a model.json from an earlier run: its parameters")
    parser.add_argument(
        "--gpu", action="append", default=[], metavar="NAME=VALUE", help="override a GPU_CLUSTER parameter"
    )
    parser.add_argument("--ranks-per-machine", type=int, default=model.GPU_RANKS_PER_MACHINE)
    parser.add_argument("--machines", type=int, default=8, help="machines of the size sweep and crossover")
    parser.add_argument(
        "--min-shard", type=_size, default=DEFAULT_MIN_SHARD_SIZE, help="the floor predicted (default: fairring's)"
    )
    parser.add_argument("--slice-size", type=_size, default=model.FairringSettings().slice_size)
    parser.add_argument("--total-memory", type=_size, default=model.FairringSettings().total_memory)
    return parser.parse_args(argv)


# --- parameters ------------------------------------------------------------------------------


def _link_key(link: str | None) -> str:
    return link or "loopback"


def _gpu_params(args: argparse.Namespace, saved: dict[str, Any]) -> model.Params:
    params = model.params_from_dict(saved["gpu"]["params"]) if "gpu" in saved else model.GPU_CLUSTER
    for item in args.gpu:
        name, _, value = item.partition("=")
        kind = type(getattr(params, name))
        params = replace(params, **{name: kind(float(value)) if kind is not str else value})
    return params


def _emulated_params(
    args: argparse.Namespace, saved: dict[str, Any], link: str | None, records: list[model.Record]
) -> tuple[model.Params, str]:
    """The parameters for one link setting, and where they come from."""
    known = saved.get("emulated", {}).get(_link_key(link))
    if known is not None:
        return model.params_from_dict(known["params"]), f"from {args.params}"
    if args.predict_only:
        return model.emulated_params(link), "defaults"
    return model.calibrate(records), "fitted"


# --- tables ----------------------------------------------------------------------------------


def _format_params(params: model.Params) -> str:
    rows = []
    for name, value in asdict(params).items():
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        if name.endswith("_Bps") and isinstance(value, float):
            text += f" ({value / 1e9:.3g} GB/s)"
        elif name.endswith("_s") and isinstance(value, float):
            text += f" ({value * 1e6:.4g} us)"
        rows.append(f"  {name:18s} {text}")
    return "\n".join(rows)


def _record_row(record: model.Record, params: model.Params) -> dict[str, Any]:
    predicted = model.model_time(record, params)
    return {
        "source": record.source,
        "study": record.study,
        "backend": record.backend,
        "bytes": record.tensor_bytes,
        "machines": record.machines,
        "ranks_per_machine": record.ranks_per_machine,
        "buckets": record.ops,
        "inflight": record.inflight,
        "measured_s": record.per_op_s,
        "model_s": predicted,
        "error": predicted / record.per_op_s - 1,
    }


def _print_residuals(rows: list[dict[str, Any]]) -> None:
    print(f"  {'file':34s} {'study':8s} {'backend':8s} {'size':>9s} {'MxL':>4s} {'inflight':>8s} "
          f"{'measured':>10s} {'model':>10s} {'error':>7s}")  # fmt: skip
    for row in rows:
        inflight = "" if row["inflight"] is None else str(row["inflight"])
        print(
            f"  {row['source']:34s} {row['study']:8s} {row['backend']:8s} {format_bytes(row['bytes']):>9s} "
            f"{row['machines']}x{row['ranks_per_machine']:<2d} {inflight:>8s} {row['measured_s'] * 1e3:8.2f}ms "
            f"{row['model_s'] * 1e3:8.2f}ms {row['error']:+7.1%}"
        )


# --- predictions -----------------------------------------------------------------------------


def _variants(args: argparse.Namespace, params: model.Params) -> dict[str, model.FairringSettings]:
    """fairring without the floor (the old plan), with it, and with it plus the size dispatch."""
    old = model.FairringSettings(slice_size=args.slice_size, total_memory=args.total_memory)
    floor = replace(old, min_shard=args.min_shard)
    threshold = model.crossover(args.machines, args.ranks_per_machine, params, floor) or 0
    return {
        "fairring, no floor": old,
        "fairring, floor": floor,
        "fairring, floor + dispatch": replace(floor, flat_threshold=threshold),
    }


def _size_curves(args: argparse.Namespace, params: model.Params) -> dict[str, list[float]]:
    sizes = model.size_grid(64 * 1024, GiB, per_octave=4)
    M, L = args.machines, args.ranks_per_machine
    curves: dict[str, list[float]] = {"bytes": [float(s) for s in sizes]}
    for name, settings in _variants(args, params).items():
        curves[name] = [model.fairring_time(s, M, L, params, settings) for s in sizes]
    curves["NCCL ring"] = [model.ring_time(s, M, L, params, pipelined=True) for s in sizes]
    curves["NCCL tree"] = [model.tree_time(s, M, L, params) for s in sizes]
    curves["hierarchical bound"] = [model.bound_time(s, M, params) for s in sizes]
    return curves


def _speedups(args: argparse.Namespace, params: model.Params, size: int, ops: int) -> dict[str, list[float]]:
    """NCCL's time over fairring's, by machine count, for `ops` all-reduces of `size`."""
    L = args.ranks_per_machine
    result: dict[str, list[float]] = {}
    for name, settings in list(_variants(args, params).items())[:2]:
        result[name] = [
            ops * model.nccl_time(size, M, L, params) / model.fairring_time(size, M, L, params, settings, ops)
            for M in MACHINES
        ]
    return result


def _shards(args: argparse.Namespace, params: model.Params, size: int) -> dict[str, list[dict[str, Any]]]:
    L = args.ranks_per_machine
    result: dict[str, list[dict[str, Any]]] = {}
    for name, settings in list(_variants(args, params).items())[:2]:
        plans = [model.plan(size, M, L, settings) for M in MACHINES]
        result[name] = [{"machines": M, **asdict(p)} for M, p in zip(MACHINES, plans, strict=True)]
    return result


def _gpu_summary(args: argparse.Namespace, params: model.Params) -> dict[str, Any]:
    variants = _variants(args, params)
    crossover = {
        name: model.crossover(args.machines, args.ranks_per_machine, params, s)
        for name, s in list(variants.items())[:2]
    }
    return {
        "params": asdict(params),
        "ranks_per_machine": args.ranks_per_machine,
        "machines": MACHINES,
        "settings": {name: asdict(s) for name, s in variants.items()},
        "crossover_bytes": crossover,
        "size_curves": _size_curves(args, params),
        "speedup_vs_nccl": {
            format_bytes(size): _speedups(args, params, size, 1) for size in (4 * MiB, BUCKET, 256 * MiB, GiB)
        }
        | {f"{BUCKETS} x {format_bytes(BUCKET)}": _speedups(args, params, BUCKET, BUCKETS)},
        "shards": {format_bytes(size): _shards(args, params, size) for size in (BUCKET, GiB)},
    }


def _print_gpu(summary: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\nGPU cluster, {args.ranks_per_machine} ranks per machine:")
    print(_format_params(model.params_from_dict(summary["params"])))
    for name, size in summary["crossover_bytes"].items():
        where = format_bytes(size) if size is not None else "none up to 1 GiB"
        print(f"  crossover against NCCL at {args.machines} machines, {name}: {where}")
    for name, plans in summary["shards"]["1 GiB"].items():
        last = plans[-1]
        flag = " (below the floor: staging caps the slice)" if last["below_floor"] else ""
        print(
            f"  1 GiB at {last['machines']} machines, {name}: slices of {format_bytes(last['slice_bytes'])}, "
            f"shards of {format_bytes(last['shard_bytes'])}{flag}"
        )
    print(f"  NCCL time / fairring time by machines {MACHINES}:")
    for label, curves in summary["speedup_vs_nccl"].items():
        for name, values in curves.items():
            print(f"    {label:>14s} {name:20s} " + " ".join(f"{v:5.2f}" for v in values))


# --- plots -----------------------------------------------------------------------------------


def _save(figure: Any, folder: Path, stem: str) -> list[Path]:
    import matplotlib.pyplot as plt

    written = []
    figure.tight_layout()
    for suffix in ("png", "svg"):
        path = folder / f"{stem}.{suffix}"
        figure.savefig(path)
        written.append(path)
    plt.close(figure)
    return written


def _plot_sizes(summary: dict[str, Any], args: argparse.Namespace, folder: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    curves = dict(summary["size_curves"])
    sizes = [s / MiB for s in curves.pop("bytes")]
    nccl = [min(r, t) for r, t in zip(curves["NCCL ring"], curves["NCCL tree"], strict=True)]
    figure, (times, ratio) = plt.subplots(1, 2, figsize=(12, 4.4))
    for name, values in curves.items():
        style = "k--" if name == "hierarchical bound" else ":" if name.startswith("NCCL") else "-"
        times.plot(sizes, [v * 1e3 for v in values], style, label=name)
        if name.startswith("fairring"):
            ratio.plot(sizes, [n / v for n, v in zip(nccl, values, strict=True)], label=name)
    ratio.axhline(1.0, color="k", linewidth=0.8)
    times.set_ylabel("time per all-reduce (ms)")
    ratio.set_ylabel("NCCL's time / fairring's (above 1: fairring faster)")
    gpus = args.machines * args.ranks_per_machine
    for axes in (times, ratio):
        axes.set_xscale("log")
        axes.set_xlabel("all-reduce size (MiB)")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8)
        axes.set_title(f"model: {args.machines} machines x {args.ranks_per_machine} GPUs ({gpus})")
    times.set_yscale("log")
    return _save(figure, folder, f"size-{args.machines}-machines")


def _plot_speedups(summary: dict[str, Any], args: argparse.Namespace, folder: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    gpus = [M * args.ranks_per_machine for M in MACHINES]
    labels = list(summary["speedup_vs_nccl"])
    figure, (single, stream) = plt.subplots(1, 2, figsize=(12, 4.4))
    for index, label in enumerate(labels):
        axes = stream if label.startswith(f"{BUCKETS} x") else single
        for name, values in summary["speedup_vs_nccl"][label].items():
            style = "-" if name.endswith("floor") and "no" not in name else "--"
            axes.plot(gpus, values, style, color=f"C{index}", marker="o", label=f"{label}, {name}")
    single.set_title("one all-reduce")
    stream.set_title(f"{BUCKETS} buckets of {format_bytes(BUCKET)} back to back")
    for axes in (single, stream):
        axes.axhline(1.0, color="k", linewidth=0.8)
        axes.set_xscale("log", base=2)
        axes.set_xlabel(f"GPUs ({args.ranks_per_machine} per machine)")
        axes.set_ylabel("NCCL's time / fairring's")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=7)
    return _save(figure, folder, "speedup-vs-machines")


def _plot_shards(summary: dict[str, Any], args: argparse.Namespace, folder: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.4))
    for index, (label, variants) in enumerate(summary["shards"].items()):
        for name, plans in variants.items():
            style = "--" if "no floor" in name else "-"
            axes.plot(MACHINES, [p["shard_bytes"] / 1024 for p in plans], style, color=f"C{index}", marker="o",
                      label=f"{label}, {name}")  # fmt: skip
            below = [p for p in plans if p["below_floor"]]
            axes.plot([p["machines"] for p in below], [p["shard_bytes"] / 1024 for p in below], "rx")
    axes.axhline(args.min_shard / 1024, color="k", linewidth=0.8, label="floor (x: staging too small)")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log", base=2)
    axes.set_xlabel(f"machines ({args.ranks_per_machine} GPUs each)")
    axes.set_ylabel("shard (KiB)")
    axes.set_title(f"shard size, {format_bytes(args.total_memory)} of staging")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    return _save(figure, folder, "shard-vs-machines")


def _plot_measured(link: str, records: list[model.Record], params: model.Params, folder: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(1, 3, figsize=(16, 4.4))
    _measured_sizes(panels[0], [r for r in records if r.study == "single" and r.settings.adaptive], params)
    _measured_machines(panels[1], [r for r in records if r.study == "scaling" and r.settings.adaptive], params)
    _measured_parity(panels[2], records, params)
    figure.suptitle(f"emulated cluster, {link}: measured (points) and model (lines)")
    return _save(figure, folder, f"measured-{link}")


def _empty(axes: Any) -> None:
    axes.text(0.5, 0.5, "no records of this study", ha="center", va="center", transform=axes.transAxes)
    axes.set_axis_off()


def _measured_sizes(axes: Any, records: list[model.Record], params: model.Params) -> None:
    axes.set_title("one all-reduce, by size")
    if not records:
        _empty(axes)
        return
    M, L, settings = records[0].machines, records[0].ranks_per_machine, records[0].settings
    sizes = model.size_grid(1024, max(r.tensor_bytes for r in records), per_octave=4)
    for index, backend in enumerate(("gloo", "fairring")):
        chosen = [r for r in records if r.backend == backend and (r.machines, r.ranks_per_machine) == (M, L)]
        axes.plot([r.tensor_bytes / MiB for r in chosen], [r.per_op_s * 1e3 for r in chosen], "o",
                  color=f"C{index}", label=f"{backend}, measured")  # fmt: skip
        model_of = model.fairring_time if backend == "fairring" else None
        times = [
            model_of(s, M, L, params, settings) if model_of else model.delegate_time(s, M, L, params) for s in sizes
        ]
        axes.plot([s / MiB for s in sizes], [t * 1e3 for t in times], "-", color=f"C{index}", label=f"{backend}, model")
    axes.plot([s / MiB for s in sizes], [model.bound_time(s, M, params) * 1e3 for s in sizes], "k--", label="bound")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel(f"size (MiB), {M} machines x {L} ranks")
    axes.set_ylabel("time (ms)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)


def _measured_machines(axes: Any, records: list[model.Record], params: model.Params) -> None:
    axes.set_title("one all-reduce, by machines")
    if not records:
        _empty(axes)
        return
    S, L, settings = records[0].tensor_bytes, records[0].ranks_per_machine, records[0].settings
    machines = list(range(1, max(r.machines for r in records) + 1))
    for index, backend in enumerate(("gloo", "fairring")):
        chosen = [r for r in records if r.backend == backend and r.tensor_bytes == S]
        axes.plot([r.machines for r in chosen], [r.per_op_s * 1e3 for r in chosen], "o", color=f"C{index}",
                  label=f"{backend}, measured")  # fmt: skip
        if backend == "fairring":
            times = [model.fairring_time(S, M, L, params, settings) for M in machines]
        else:
            times = [model.delegate_time(S, M, L, params) for M in machines]
        axes.plot(machines, [t * 1e3 for t in times], "-", color=f"C{index}", label=f"{backend}, model")
    axes.plot(machines, [model.bound_time(S, M, params) * 1e3 for M in machines], "k--", label="bound")
    axes.set_xticks(machines)
    axes.set_xlabel(f"machines ({L} ranks each), {format_bytes(S)}")
    axes.set_ylabel("time (ms)")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)


def _measured_parity(axes: Any, records: list[model.Record], params: model.Params) -> None:
    for index, backend in enumerate(("gloo", "fairring")):
        chosen = [r for r in records if r.backend == backend]
        axes.plot([r.per_op_s * 1e3 for r in chosen], [model.model_time(r, params) * 1e3 for r in chosen], "o",
                  color=f"C{index}", label=backend, alpha=0.7)  # fmt: skip
    low = min(r.per_op_s for r in records) * 1e3 / 1.5
    high = max(r.per_op_s for r in records) * 1e3 * 1.5
    axes.plot([low, high], [low, high], "k-", linewidth=0.8)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("measured (ms per all-reduce)")
    axes.set_ylabel("model (ms)")
    axes.set_title("every record")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)


# --- main ------------------------------------------------------------------------------------


def _emulated(args: argparse.Namespace, saved: dict[str, Any], records: list[model.Record]) -> dict[str, Any]:
    groups: dict[str | None, list[model.Record]] = {}
    for record in records:
        groups.setdefault(record.link, []).append(record)
    result: dict[str, Any] = {}
    for link, chosen in sorted(groups.items(), key=lambda item: _link_key(item[0])):
        params, how = _emulated_params(args, saved, link, chosen)
        rows = [_record_row(record, params) for record in chosen]
        rms = float((model.residuals(chosen, params) ** 2).mean() ** 0.5)
        print(f"\n{_link_key(link)}: {len(chosen)} records, parameters {how}, rms log error {rms:.3f}")
        print(_format_params(params))
        _print_residuals(rows)
        result[_link_key(link)] = {"params": asdict(params), "rms_log_error": rms, "records": rows}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    saved = json.loads(args.params.read_text()) if args.params else {}
    import matplotlib

    matplotlib.use("Agg")
    args.out.mkdir(parents=True, exist_ok=True)
    records = model.load_records(args.records)
    emulated = _emulated(args, saved, records)
    summary = _gpu_summary(args, _gpu_params(args, saved))
    _print_gpu(summary, args)
    written = _plot_sizes(summary, args, args.out)
    written += _plot_speedups(summary, args, args.out)
    written += _plot_shards(summary, args, args.out)
    for key, fitted in emulated.items():
        link = None if key == "loopback" else key
        chosen = [r for r in records if r.link == link]
        written += _plot_measured(key, chosen, model.params_from_dict(fitted["params"]), args.out)
    output = args.out / "model.json"
    output.write_text(json.dumps({"emulated": emulated, "gpu": summary}, indent=1) + "\n")
    print("\nwrote " + " ".join(str(path) for path in [*written, output]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
