"""One rank of the training study (fairring.bench.training), started by torchrun.

Trains one model with DDP (or FSDP2's fully_shard, --parallel fsdp2) over
fairring and then over the baseline (Gloo for CPU tensors, NCCL for CUDA) from the
same initial weights on the same data, and has rank 0 print a row per backend and
write the records.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import fairring
from fairring._config import load_config

from .training_models import REAL_MODELS, SHAPED_MODELS, EmulatedNet
from .worker import die_with_the_agent, environment, rank_device

# The losses compared between the backends: the first this many steps.
PARITY_STEPS = 20
COLUMNS = (
    ("backend", 9),
    ("median s", 9),
    ("issued s", 9),
    ("spread s", 13),
    ("samples/s", 10),
    ("vs base", 8),
    ("comm hidden", 12),
    ("loss gap", 9),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("real", "emulated"), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, required=True, help="timed steps")
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--autocast", action="store_true", help="bf16 autocast (real compute)")
    parser.add_argument(
        "--parallel", choices=("ddp", "fsdp2"), default="ddp", help="real compute: DDP, or fully_shard per block"
    )
    parser.add_argument("--flops-per-s", type=float, default=0.0, help="emulated: the GPU's achieved FLOP/s")
    parser.add_argument("--scale", type=float, default=1.0, help="emulated: how much slower the emulated network is")
    parser.add_argument("--link", default="", help="the NIC rate as given, for the records")
    parser.add_argument("--json", type=Path, required=True)
    return parser.parse_args(argv)


def train(
    model: torch.nn.Module,
    group: dist.ProcessGroup,
    step_fn: Callable[[torch.nn.Module, int], torch.Tensor],
    steps: int,
    sync: bool = True,
    first_step: int = 0,
    momentum: float = 0.9,
) -> tuple[list[float], list[float], list[float]]:
    """Seconds, rank 0's loss and the seconds its host took to issue the step (until the GPU is waited
    for: the rest of the step the host could have queued more work) of each step; with sync=False, DDP
    skips its all-reduces."""
    # A small step. Training the CNN on batches this small is chaotic: a 1e-7 nudge to its weights
    # (what another summation order makes) grows to 2e-4 in the loss within 20 steps at lr 1e-4,
    # so no two backends could agree to 1e-5; at 2e-5 it stays below 5e-6. The time per step does
    # not depend on it. Momentum only where it fits: 8 ranks of GPT-2 small with momentum buffers
    # and Gloo's buffers exceed this machine's 24 GiB.
    optimizer = torch.optim.SGD(model.parameters(), lr=2e-5, momentum=momentum, foreach=True)
    seconds, losses, issued = [], [], []
    for step in range(first_step, first_step + steps):
        dist.barrier(group=group)
        start = time.perf_counter()
        optimizer.zero_grad()
        if sync:
            loss = step_fn(model, step)
        else:
            with model.no_sync():
                loss = step_fn(model, step)
        optimizer.step()
        issued.append(time.perf_counter() - start)
        if loss.is_cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
    return seconds, losses, issued


def fully_sharded(model: torch.nn.Module, group: dist.ProcessGroup, device: torch.device) -> torch.nn.Module:
    """FSDP2 as torchtitan applies it: fully_shard on every transformer block, then on the root."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, device.type)
    for block in model.blocks.layers:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def measure(args: argparse.Namespace, group: dist.ProcessGroup, device: torch.device) -> dict[str, object]:
    """One backend's figures for the model in `args`."""
    rank = dist.get_rank()
    compute: list[float] | None = None
    if args.part == "real":
        spec = REAL_MODELS[args.model]
        built = spec.build().to(device)
        sharded = args.parallel == "fsdp2"
        model = fully_sharded(built, group, device) if sharded else DDP(built, process_group=group)

        def step_fn(net: torch.nn.Module, step: int) -> torch.Tensor:
            inputs, targets = (t.to(device) for t in spec.data(step, rank))
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast):
                loss = spec.loss(net, inputs, targets)
            loss.backward()
            return loss.detach().float()

        seconds, losses, issued = train(model, group, step_fn, args.warmup + args.steps)
        if not sharded:
            # The same steps again without the all-reduces: what the step costs without communication.
            # FSDP2 has no such step: it gathers the parameters it computes with.
            compute, _, _ = train(model, group, step_fn, 3, sync=False)
        samples = spec.batch
        comm = None
    else:
        shaped = SHAPED_MODELS[args.model]()
        net = EmulatedNet(shaped, args.flops_per_s, args.scale).to(device)
        model = DDP(net, process_group=group, gradient_as_bucket_view=True)
        start_tensor = torch.ones(1, device=device)

        def step_fn(ddp: torch.nn.Module, step: int) -> torch.Tensor:
            loss = ddp(start_tensor).sum()
            loss.backward()
            return loss.detach()

        seconds, losses, issued = train(model, group, step_fn, args.warmup + args.steps, momentum=0.0)
        compute, _, _ = train(model, group, step_fn, 1, sync=False, momentum=0.0)
        net.compute_scale = 0.0  # the all-reduces of every bucket, nothing to hide them behind
        comm, _, _ = train(model, group, step_fn, 1, momentum=0.0)
        samples = shaped.samples
    timed = seconds[args.warmup :]
    median = statistics.median(timed)
    record: dict[str, object] = {
        "median_s": median,
        "min_s": min(timed),
        "max_s": max(timed),
        "step_s": timed,
        "samples_per_s": samples * dist.get_world_size() / median,
        # How long the host was busy issuing a step, waits in collectives included: near the step's
        # time where the host waits for the network (the engine holds the host in wait()).
        "issue_s": statistics.median(issued[args.warmup :]),
        "losses": losses[:PARITY_STEPS],
    }
    if compute is not None:
        compute_s = statistics.median(compute)
        record |= {"compute_s": compute_s, "exposed_comm_s": max(0.0, median - compute_s)}
    if comm is not None:
        record["comm_s"] = statistics.median(comm)
    del model
    gc.collect()
    return record


def settle_overlap(records: list[dict[str, object]]) -> None:
    """Exposed and hidden communication of each backend, against one compute time for both.

    A step without its all-reduces does the same work whichever backend would have run them, so
    the lower of the two measurements is the compute time (the other was disturbed: one step, on
    2 cores shared by up to 8 ranks). Hidden: what a step would take with no communication hidden
    (compute + communication alone), less what it took, as a share of the communication.
    """
    if any("compute_s" not in record for record in records):
        return  # FSDP2: no step without communication to compare with
    compute_s = min(float(record["compute_s"]) for record in records)
    for record in records:
        record["compute_s"] = compute_s
        record["exposed_comm_s"] = max(0.0, float(record["median_s"]) - compute_s)
        if "comm_s" in record:
            comm_s = float(record["comm_s"])
            record["hidden_fraction"] = min(1.0, max(0.0, (compute_s + comm_s - float(record["median_s"])) / comm_s))


def loss_gap(ours: list[float], theirs: list[float]) -> float:
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, theirs, strict=True))


def print_header() -> None:
    print("  ".join(f"{name:>{width}}" for name, width in COLUMNS), flush=True)


def print_row(record: dict[str, object]) -> None:
    hidden = record.get("hidden_fraction")
    values = (
        record["backend"],
        f"{record['median_s']:.3f}",
        f"{record['issue_s']:.3f}",
        f"{record['min_s']:.3f}-{record['max_s']:.3f}",
        f"{record['samples_per_s']:.1f}",
        f"{record['speedup_vs_baseline']:.2f}x" if record.get("speedup_vs_baseline") else "",
        f"{hidden:.0%}"
        if hidden is not None
        else f"{record['exposed_comm_s']:.3f}s exp"
        if "exposed_comm_s" in record
        else "",
        f"{record['loss_gap']:.1e}" if record.get("loss_gap") is not None else "",
    )
    print("  ".join(f"{value:>{width}}" for value, (_, width) in zip(values, COLUMNS, strict=True)), flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    die_with_the_agent()
    gpu = rank_device() if load_config(os.environ).cuda_engine else None
    dist.init_process_group("fairring")
    cuda = gpu is not None
    device = gpu if gpu is not None else torch.device("cpu")
    baseline_name = "nccl" if cuda else "gloo"
    baseline = dist.new_group(backend=baseline_name)
    machines = int(os.environ.get("GROUP_WORLD_SIZE", 1))
    common = {
        "study": "training",
        "part": args.part,
        "model": args.model,
        "machines": machines,
        "ranks_per_machine": dist.get_world_size() // machines,
        "link": args.link,
        "autocast": args.autocast,
        "parallel": args.parallel if args.part == "real" else "ddp",
        "device": device.type,
        "baseline": baseline_name,
        "steps": args.steps,
        "warmup": args.warmup,
    }
    if args.part == "emulated":
        shaped = SHAPED_MODELS[args.model]()
        common |= {"parameters": shaped.parameters, "batch": shaped.batch, "scale": args.scale}
        # Forward and backward (twice the forward's FLOPs) on the stated GPU, times the scale.
        nominal = 3 * shaped.forward_flops / args.flops_per_s * args.scale
        common |= {"flops_per_s": args.flops_per_s, "compute_s_nominal": nominal}
    else:
        spec = REAL_MODELS[args.model]
        common |= {"parameters": sum(p.numel() for p in spec.build().parameters()), "batch": spec.batch}
    ours = {**common, "backend": "fairring", **measure(args, dist.group.WORLD, device)}
    # How many of the buckets fairring's engine served (the rest went to its delegate, below the flat threshold);
    # with FSDP2, its reduce-scatters and all-gathers (the key keeps the name earlier records have).
    stats = fairring.backend_of(device=device).engine_stats(device.type) or {}
    ours["engine_all_reduces"] = stats.get("ops", 0)
    # Ops and bytes (the N-chunk tensors') per collective kind, warm-up steps and loss checks included.
    ours["engine_by_collective"] = stats.get("by_collective", {})
    # What fairring.summary() says of the run, as a job's log would (warm-up steps and loss checks included).
    summary_line = fairring.summary().line()
    theirs = {**common, "backend": baseline_name, **measure(args, baseline, device)}
    ours["speedup_vs_baseline"] = theirs["median_s"] / ours["median_s"]
    settle_overlap([ours, theirs])
    if args.part == "real":
        ours["loss_gap"] = loss_gap(ours["losses"], theirs["losses"])
    if dist.get_rank() == 0:
        print_header()
        print_row(theirs)
        print_row(ours)
        print(f"fairring._summary: {summary_line}", flush=True)
        payload = {"environment": environment(device.type), "records": [theirs, ours]}
        args.json.write_text(json.dumps(payload))
    dist.barrier(group=baseline)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
