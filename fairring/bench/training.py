"""The training study: DDP and FSDP2 training end to end, fairring against Gloo (NCCL with --cuda) in the same run.

    python -m fairring.bench --study training               # both parts (below), about 25 minutes
    python -m fairring.bench --study training --part real   # real compute only
    python -m fairring.bench --study training --quick       # tiny models, a few steps, on loopback (CI)

Real compute: a ResNet-18-like CNN (11M parameters, fp32, 4 images of 32x32
per rank) and a GPT-shaped transformer (29M, bf16 autocast, 2 sequences of 64
tokens) really trained by DDP on synthetic data, the transformer also by FSDP2
(fully_shard per block: its reduce-scatters and all-gathers), on
2 hosts x 2 ranks at 1 Gbit/s and on loopback. Both backends start from the
same weights and see the same data, so their losses must agree.

Emulated compute at real model shapes: ResNet-50, BERT-base and GPT-2 small,
their parameters layer by layer, trained by DDP with its real buckets, hooks
and overlap, but with each layer's forward and backward a sleep as long as the
stated GPU (--gpu-tflops at --mfu) would compute it, multiplied by how much
slower the emulated 1 Gbit/s NICs are than --real-link. The ratio of compute to
communication is then a real cluster's, while this machine's cores stay free
for communication. On 2x2, 4x2 and 8x1 hosts.

Rows print as each run ends; records go to --json (default
bench-results/training.json), plots to --plots; a sentence of reading ends it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from pathlib import Path

from fairring._sizes import parse_rate

from . import BASELINE_NAMES
from .launch import Run, hosts_for, run_agents
from .netns import netns_available
from .training_plots import model_name

# --json's default in the microbenchmark, which the study replaces with its own file.
MICROBENCHMARK_JSON = Path("bench-results/allreduce.json")
STUDY_LINK = "1gbit"
# Model, bf16 autocast, parallelism: DDP, or FSDP2's fully_shard per block.
REAL_RUNS = (("cnn", False, "ddp"), ("gpt", True, "ddp"), ("gpt", True, "fsdp2"))
QUICK_RUNS = (("cnn-tiny", False, "ddp"), ("gpt-tiny", True, "ddp"), ("gpt-tiny", True, "fsdp2"))
SHAPED = ("resnet50", "bert-base", "gpt2-small")
LAYOUTS = ((2, 2), (4, 2), (8, 1))


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training study (--study training)")
    group.add_argument("--part", choices=("real", "emulated", "both"), default="both", help="default both")
    group.add_argument("--quick", action="store_true", help="tiny real models, 5 steps, loopback: loss parity only")
    group.add_argument(
        "--parallelism", choices=("ddp", "fsdp2", "both"), default="both", help="real: which runs (default both)"
    )
    group.add_argument("--real-layouts", default="2x2", help="real: hosts x ranks (default %(default)s)")
    group.add_argument(
        "--real-models",
        help="real: comma-separated, of cnn, gpt, gpt-124m, cnn-tiny, gpt-tiny, each with bf16 autocast (default: "
        "the study's runs)",
    )
    group.add_argument("--real-steps", type=int, help="real: timed steps, after 2 of warmup (default 18; --quick 4)")
    group.add_argument(
        "--hosts-only", action="store_true", help="real: on the shaped hosts only, not again on loopback"
    )
    group.add_argument("--cuda", action="store_true", help="CUDA tensors, the CUDA engine on, against NCCL")
    group.add_argument("--gpu-tflops", type=float, default=989.0, help="emulated: GPU peak (default 989, H100 bf16)")
    group.add_argument("--mfu", type=float, default=0.4, help="emulated: share of the peak achieved (default 0.4)")
    group.add_argument(
        "--real-link", default="100gbit", help="emulated: one real machine's network, as a tc rate (default 100gbit)"
    )
    group.add_argument("--models", help=f"emulated: comma-separated, of {', '.join(SHAPED)} (default all)")
    layouts = ",".join(f"{m}x{r}" for m, r in LAYOUTS)
    group.add_argument(
        "--layouts", default=layouts, help="emulated and --study dispatch: hosts x ranks (default %(default)s)"
    )


def _namespace(args: argparse.Namespace, link: str | None) -> argparse.Namespace:
    """The launcher's view of one run: on hosts with `link` NICs, or on loopback (None)."""
    return argparse.Namespace(**{**vars(args), "link": link, "netns": link is not None, "mtu": args.mtu})


def parse_layouts(text: str) -> list[tuple[int, int]]:
    """--layouts: "2x2,8x1" as (hosts, ranks per host) pairs."""
    return [(int(hosts), int(ranks)) for hosts, ranks in (layout.split("x") for layout in text.split(","))]


def plan(args: argparse.Namespace, hosts_possible: bool) -> list[tuple[str, Run, str | None]]:
    """(what, run, link) for every run of the study, in order."""
    runs: list[tuple[str, Run, str | None]] = []
    user_env = dict(assignment.split("=", 1) for assignment in args.set)
    if args.quick:
        # The tiny models' buckets are below the flat threshold: send them to the engine anyway.
        user_env.setdefault("FAIRRING_FLAT_THRESHOLD", "0")
    if args.cuda:
        user_env["FAIRRING_CUDA_ENGINE"] = "1"
    if args.part in ("real", "both"):
        steps, warmup = (4, 1) if args.quick else (18, 2)
        if args.real_steps:
            steps, warmup = args.real_steps, 2
        links: list[str | None] = [None] if args.quick or not hosts_possible else [args.link or STUDY_LINK, None]
        if args.hosts_only and hosts_possible:
            links = [args.link or STUDY_LINK]
        runs_of = QUICK_RUNS if args.quick else REAL_RUNS
        if args.real_models:
            parallel = ("ddp", "fsdp2") if args.parallelism == "both" else (args.parallelism,)
            runs_of = tuple((name, True, way) for name in args.real_models.split(",") for way in parallel)
        chosen = [run for run in runs_of if args.parallelism in ("both", run[2])]
        for (machines, ranks), link in itertools.product(parse_layouts(args.real_layouts), links):
            for model, autocast, parallel in chosen:
                worker = ["fairring.bench.training_worker", "--part", "real", "--model", model]
                worker += ["--steps", str(steps), "--warmup", str(warmup), "--link", link or ""]
                worker += ["--autocast"] if autocast else []
                worker += ["--parallel", parallel]
                where = f"{link} hosts" if link else "loopback"
                run = Run("training", machines, [], environment=user_env, worker=tuple(worker), ranks_per_machine=ranks)
                runs.append((f"real compute: {model} ({parallel}) on {machines}x{ranks}, {where}", run, link))
    if args.part in ("emulated", "both") and not args.quick and hosts_possible:
        link = args.link or STUDY_LINK
        scale = parse_rate(args.real_link) / parse_rate(link)
        flops = args.gpu_tflops * 1e12 * args.mfu
        for machines, ranks in parse_layouts(args.layouts):
            for model in args.models.split(",") if args.models else SHAPED:
                worker = ["fairring.bench.training_worker", "--part", "emulated", "--model", model]
                worker += ["--steps", "3", "--warmup", "1", "--link", link]
                worker += ["--flops-per-s", str(flops), "--scale", str(scale)]
                run = Run("training", machines, [], environment=user_env, worker=tuple(worker), ranks_per_machine=ranks)
                runs.append((f"emulated compute: {model} on {machines}x{ranks}, {link} hosts", run, link))
    return runs


def run_training_study(args: argparse.Namespace, argv: list[str]) -> int:
    if args.real_models:
        from .training_models import REAL_MODELS

        unknown = sorted(set(args.real_models.split(",")) - set(REAL_MODELS))
        if unknown:
            print(f"fairring.bench: --real-models: no model {', '.join(unknown)}; they are {', '.join(REAL_MODELS)}")
            return 2
    if args.cuda:
        import torch

        if not torch.cuda.is_available():
            print("fairring.bench: --cuda needs a GPU, and this machine has none; nothing was run.")
            return 1
    hosts_possible, reason = netns_available()
    if args.loopback:
        hosts_possible, reason = False, "--loopback"
    if not hosts_possible and not args.quick:
        print(f"note: network namespaces are unavailable ({reason}): real compute runs on loopback only, and the "
              "emulated-compute part, which needs shaped NICs, is left out.")  # fmt: skip
    if args.part == "emulated" and args.quick:
        print("note: --quick runs the real-compute part only.")
    records: list[dict] = []
    environment: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        for index, (what, run, link) in enumerate(plan(args, hosts_possible)):
            print(f"== {what}", flush=True)
            output = Path(scratch) / f"run{index}.json"
            view = _namespace(args, link)
            with hosts_for(view, run.machines) as hosts:
                status = run_agents(view, run, hosts, output, {})
            if status != 0:
                return status
            result = json.loads(output.read_text())
            environment = result["environment"]
            records += result["records"]
    path = MICROBENCHMARK_JSON.with_name("training.json") if args.json == MICROBENCHMARK_JSON else args.json
    path.parent.mkdir(parents=True, exist_ok=True)
    study = {"gpu_tflops": args.gpu_tflops, "mfu": args.mfu, "real_link": args.real_link}
    payload = {"command": ["python", "-m", "fairring.bench", *argv], "environment": environment, "study": study}
    path.write_text(json.dumps({**payload, "records": records}, indent=1))
    print(f"records: {path}")
    from .training_plots import plot_training

    for picture in plot_training(records, args.plots):
        print(f"plot: {picture}")
    print(reading(records, args))
    return 0


def reading(records: list[dict], args: argparse.Namespace) -> str:
    """One sentence: where fairring won and lost, and whether the losses agreed."""
    ours = [r for r in records if r["backend"] == "fairring"]
    parts = []
    real = [r for r in ours if r["part"] == "real"]
    if real:
        gap = max(r["loss_gap"] for r in real)
        speedups = ", ".join(
            f"{model_name(r)} {r['speedup_vs_baseline']:.2f}x ({r['link'] or 'loopback'})" for r in real
        )
        baselines = " or ".join(sorted({BASELINE_NAMES.get(r["baseline"], r["baseline"]) for r in real}))
        parts.append(f"with real compute fairring trained at {speedups} {baselines}'s speed, losses within {gap:.1e}")
    emulated = [r for r in ours if r["part"] == "emulated"]
    if emulated:
        best = max(emulated, key=lambda r: r["speedup_vs_baseline"])
        worst = min(emulated, key=lambda r: r["speedup_vs_baseline"])
        parts.append(
            f"with emulated {args.gpu_tflops:g}-TFLOP/s GPUs at {args.mfu:.0%} over {args.real_link} per machine "
            f"it ranged from {worst['speedup_vs_baseline']:.2f}x ({worst['model']}, "
            f"{worst['machines']}x{worst['ranks_per_machine']}) to {best['speedup_vs_baseline']:.2f}x "
            f"({best['model']}, {best['machines']}x{best['ranks_per_machine']})"
        )
    return ("Reading: " + "; ".join(parts) + ".") if parts else "Reading: nothing was measured."
