"""What a collective fairring delegates costs, against its delegate called directly (`make delegated-cost`).

fairring hands every collective but the large all-reduce to Gloo (CPU) or NCCL
(CUDA), through its funnel: the ledger, the memory order, the hooks. This runs
the delegated collectives the way FSDP2, ZeRO and DDP issue them (async,
several in flight, views of shared buffers) through a fairring group and
through a Gloo or NCCL group of the same ranks, in the same processes and on
the same tensors, the two alternated round by round, and prints for each
pattern the time per op and the time spent issuing, with fairring's ratio to
the delegate. A ratio within noise of 1.0 is the goal: the funnel costs
nothing. Every round's results are checked against a plain torch computation.

Machines are emulated on loopback (FAIRRING_MACHINE_ID), where the CPUs bound
the run: what is measured is the issuing, not a network.

    python benchmarks/delegated_cost.py                        # 2x2, CPU (Gloo), 8 MiB, 4 in flight
    python benchmarks/delegated_cost.py --layout 4x2 --size 2MiB --rounds 20
    python benchmarks/delegated_cost.py --device cuda           # NCCL; one GPU: an NCCL host per process
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairring._sizes import format_bytes, parse_size
from fairring.bench import free_port

# Issued: the Works to wait for. Checked: whether every output holds what a plain torch computation says.
Issue = Callable[[dist.ProcessGroup], list[dist.Work]]
Check = Callable[[], bool]


@dataclass
class Pattern:
    """One way a training framework issues a delegated collective: `ops` of them in flight."""

    name: str
    how: str
    # Makes the tensors of one round (filled afresh every round, untimed): what to issue, and its check.
    prepare: Callable[[], tuple[Issue, Check]]


def patterns(numel: int, ops: int, device: torch.device) -> list[Pattern]:
    """The patterns, each of `ops` collectives of `numel` elements (float32) in flight."""
    world, rank = dist.get_world_size(), dist.get_rank()
    shard = numel // world
    sums = [float(world * (world + 1) // 2 + world * op) for op in range(ops)]

    def filled(op: int, count: int) -> torch.Tensor:
        return torch.full((count,), float(rank + 1 + op), device=device)

    def fsdp2_all_gather() -> tuple[Issue, Check]:
        # FSDP2's all_gather_single: in place, the input a view of the output at this rank's shard.
        outputs = [torch.zeros(numel, device=device) for _ in range(ops)]
        for op, output in enumerate(outputs):
            output.narrow(0, rank * shard, shard).fill_(float(rank + 1 + op))

        def issue(group: dist.ProcessGroup) -> list[dist.Work]:
            return [
                dist.all_gather_into_tensor(out, out.narrow(0, rank * shard, shard), group=group, async_op=True)
                for out in outputs
            ]

        def check() -> bool:
            return all(
                torch.equal(out.view(world, shard)[r], torch.full((shard,), float(r + 1 + op), device=device))
                for op, out in enumerate(outputs)
                for r in range(world)
            )

        return issue, check

    def fsdp2_reduce_scatter() -> tuple[Issue, Check]:
        # FSDP2's reduce_scatter_single: a fresh flat input per group, the output new_empty.
        inputs = [filled(op, numel) for op in range(ops)]
        outputs = [torch.empty(shard, device=device) for _ in range(ops)]

        def issue(group: dist.ProcessGroup) -> list[dist.Work]:
            return [
                dist.reduce_scatter_tensor(out, inp, group=group, async_op=True)
                for out, inp in zip(outputs, inputs, strict=True)
            ]

        def check() -> bool:
            return all(torch.all(out == sums[op]).item() for op, out in enumerate(outputs))

        return issue, check

    def zero_reduce_scatter() -> tuple[Issue, Check]:
        # ZeRO-2: buckets of one flat gradient buffer, each reduced into a view of one partition buffer.
        grads = torch.cat([filled(op, numel) for op in range(ops)])
        partition = torch.empty(ops * shard, device=device)

        def issue(group: dist.ProcessGroup) -> list[dist.Work]:
            return [
                dist.reduce_scatter_tensor(out, bucket, group=group, async_op=True)
                for out, bucket in zip(partition.chunk(ops), grads.chunk(ops), strict=True)
            ]

        def check() -> bool:
            return all(torch.all(out == sums[op]).item() for op, out in enumerate(partition.chunk(ops)))

        return issue, check

    def zero_all_gather() -> tuple[Issue, Check]:
        # ZeRO-1/2's parameter gather: views of one partition buffer into views of one flat buffer.
        partition = torch.cat([filled(op, shard) for op in range(ops)])
        flat = torch.empty(ops * numel, device=device)

        def issue(group: dist.ProcessGroup) -> list[dist.Work]:
            return [
                dist.all_gather_into_tensor(out, part, group=group, async_op=True)
                for out, part in zip(flat.chunk(ops), partition.chunk(ops), strict=True)
            ]

        def check() -> bool:
            expected = [torch.cat([torch.full((shard,), float(r + 1 + op)) for r in range(world)]) for op in range(ops)]
            return all(torch.equal(out.cpu(), expected[op]) for op, out in enumerate(flat.chunk(ops)))

        return issue, check

    def ddp_all_reduce() -> tuple[Issue, Check]:
        # DDP's buckets below the flat threshold: views of one gradient buffer.
        grads = torch.cat([filled(op, numel) for op in range(ops)])

        def issue(group: dist.ProcessGroup) -> list[dist.Work]:
            return [dist.all_reduce(bucket, group=group, async_op=True) for bucket in grads.chunk(ops)]

        def check() -> bool:
            return all(torch.all(bucket == sums[op]).item() for op, bucket in enumerate(grads.chunk(ops)))

        return issue, check

    def broadcast() -> tuple[Issue, Check]:
        # DDP's and FSDP's parameter sync at start: views of one buffer, from rank 0.
        params = torch.cat([filled(op, numel) for op in range(ops)])

        def issue(group: dist.ProcessGroup) -> list[dist.Work]:
            return [dist.broadcast(view, src=0, group=group, async_op=True) for view in params.chunk(ops)]

        def check() -> bool:
            return all(torch.all(view == float(1 + op)).item() for op, view in enumerate(params.chunk(ops)))

        return issue, check

    return [
        Pattern("fsdp2_all_gather", "all_gather_into_tensor, in place", fsdp2_all_gather),
        Pattern("fsdp2_reduce_scatter", "reduce_scatter_tensor, fresh tensors", fsdp2_reduce_scatter),
        Pattern("zero_reduce_scatter", "reduce_scatter_tensor, views", zero_reduce_scatter),
        Pattern("zero_all_gather", "all_gather_into_tensor, views", zero_all_gather),
        Pattern("ddp_all_reduce", "all_reduce (delegated), views", ddp_all_reduce),
        Pattern("broadcast", "broadcast, views", broadcast),
    ]


def timed_round(pattern: Pattern, group: dist.ProcessGroup, device: torch.device) -> tuple[float, float, bool]:
    """Seconds issuing, seconds until every op completed, and whether the results matched."""
    issue, check = pattern.prepare()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier(group=group)
    start = time.perf_counter()
    works = issue(group)
    issued = time.perf_counter()
    for work in works:
        work.wait()
    if device.type == "cuda":
        torch.cuda.synchronize()
    done = time.perf_counter()
    return issued - start, done - start, check()


def rank_main(rank: int, args: argparse.Namespace, port: int) -> None:
    machines, local = args.machines, args.ranks_per_machine
    world = machines * local
    os.environ["FAIRRING_MACHINE_ID"] = f"machine-{rank // local}"
    os.environ["TP_SOCKET_IFNAME"] = "lo"
    # Every all-reduce here is a delegated one: the pattern measures the funnel, not the engine.
    os.environ["FAIRRING_FLAT_THRESHOLD"] = "1TiB"
    device = torch.device("cpu")
    if args.device == "cuda":
        # NCCL refuses two ranks of one host on one GPU: each process is an NCCL host of its own.
        if torch.cuda.device_count() < world:
            os.environ.setdefault("NCCL_HOSTID", f"fairring-delegated-cost-{rank}")
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    import fairring  # noqa: F401  (registers the backend)

    dist.init_process_group(
        "fairring", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=None
    )
    delegate_name = "gloo" if device.type == "cpu" else "nccl"
    groups = {"fairring": dist.group.WORLD, delegate_name: dist.new_group(backend=delegate_name)}
    numel = parse_size("--size", args.size) // 4 // world * world
    for pattern in patterns(numel, args.ops, device):
        if args.patterns and pattern.name not in args.patterns.split(","):
            continue
        rounds: dict[str, list[tuple[float, float, bool]]] = {name: [] for name in groups}
        for round_index in range(args.warmup + args.rounds):
            # Alternated, so that neither always runs first.
            order = list(groups) if round_index % 2 == 0 else list(reversed(groups))
            for name in order:
                result = timed_round(pattern, groups[name], device)
                if round_index >= args.warmup:
                    rounds[name].append(result)
        summary = {
            name: (
                statistics.median(r[0] for r in results) / args.ops,
                statistics.median(r[1] for r in results) / args.ops,
                all(r[2] for r in results),
            )
            for name, results in rounds.items()
        }
        correct = [None] * world
        dist.all_gather_object(correct, all(s[2] for s in summary.values()))
        if rank == 0:
            (issue_f, op_f, _), (issue_d, op_d, _) = summary["fairring"], summary[delegate_name]
            print(
                f"{pattern.name:>21} {op_f * 1e3:>9.2f} {op_d * 1e3:>9.2f} {op_f / op_d:>6.2f}x "
                f"{issue_f * 1e3:>9.2f} {issue_d * 1e3:>9.2f} {issue_f / max(issue_d, 1e-9):>6.2f}x  "
                f"{'yes' if all(correct) else 'NO'}",
                flush=True,
            )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layout", default="2x2", help="machines x ranks per machine (default 2x2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: against Gloo; cuda: NCCL")
    parser.add_argument("--size", default="8MiB", help="bytes of each collective's full tensor (default 8MiB)")
    parser.add_argument("--ops", type=int, default=4, help="collectives in flight per round (default 4)")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds per backend (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument("--patterns", default="", help="comma-separated pattern names (default all)")
    args = parser.parse_args()
    args.machines, args.ranks_per_machine = (int(part) for part in args.layout.split("x"))
    delegate = "Gloo" if args.device == "cpu" else "NCCL"
    size = format_bytes(parse_size("--size", args.size))
    print(
        f"{args.layout} on loopback, {args.device}: {args.ops} ops of {size} in "
        f"flight, median of {args.rounds} rounds; per op, fairring against {delegate} called directly",
        flush=True,
    )
    print(
        f"{'pattern':>21} {'op ms':>9} {delegate + ' ms':>9} {'ratio':>7} {'issue ms':>9} {delegate + ' ms':>9} "
        f"{'ratio':>7}  correct",
        flush=True,
    )
    mp.spawn(rank_main, args=(args, free_port()), nprocs=args.machines * args.ranks_per_machine)


if __name__ == "__main__":
    main()
