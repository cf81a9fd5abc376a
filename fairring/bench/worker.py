"""One rank of a benchmark run, started by torchrun (see fairring.bench.__main__).

Times all_reduce on a fairring group and on a Gloo group over the same ranks,
checks every result against the closed-form sum of the known inputs, and has
rank 0 print a table and write one JSON record per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import fairring
from fairring.config import format_size, parse_size


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--iters", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--json", type=Path, required=True)
    return parser.parse_args(argv)


def time_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup, iters: int, warmup: int) -> list[float]:
    seconds = []
    for iteration in range(warmup + iters):
        dist.barrier(group=group)
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        elapsed = time.perf_counter() - start
        if iteration >= warmup:
            seconds.append(elapsed)
    return seconds


def check_sum(group: dist.ProcessGroup, elements: int) -> bool:
    """Rank r contributes r + 1 everywhere: the sum is n(n + 1)/2 exactly."""
    size = dist.get_world_size()
    tensor = torch.full((elements,), float(dist.get_rank() + 1))
    dist.all_reduce(tensor, group=group)
    return bool(torch.all(tensor == size * (size + 1) / 2))


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    dist.init_process_group("fairring")
    rank, size = dist.get_rank(), dist.get_world_size()
    topology = dist.group.WORLD._get_backend(torch.device("cpu")).topology
    groups = {"gloo": dist.new_group(backend="gloo"), "fairring": dist.group.WORLD}
    records = []
    if rank == 0:
        print(f"{topology.num_machines} machines x {topology.local_size} ranks, CPU float32 all_reduce", flush=True)
        columns = ("size", 10), ("backend", 9), ("median ms", 10), ("algbw GB/s", 11), ("busbw GB/s", 11)
        print(" ".join(f"{name:>{width}}" for name, width in columns), f"{'vs gloo':>8} {'ok':>3}")
    for size_text in args.sizes.split(","):
        nbytes = parse_size("--sizes", size_text)
        elements = max(1, nbytes // 4)
        medians: dict[str, float] = {}
        for name, group in groups.items():
            correct = check_sum(group, elements)
            seconds = time_all_reduce(torch.ones(elements), group, args.iters, args.warmup)
            # The op is as slow as its slowest rank.
            slowest = torch.tensor(seconds, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=groups["gloo"])
            median = statistics.median(slowest.tolist())
            medians[name] = median
            algbw = elements * 4 / median / 1e9
            record = {
                "backend": name,
                "bytes": elements * 4,
                "median_s": median,
                "min_s": min(slowest.tolist()),
                "max_s": max(slowest.tolist()),
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * 2 * (size - 1) / size,
                "speedup_vs_gloo": medians["gloo"] / median,
                "correct": correct,
                "machines": topology.num_machines,
                "ranks_per_machine": topology.local_size,
                "iters": args.iters,
                "warmup": args.warmup,
            }
            records.append(record)
            if rank == 0:
                print(
                    f"{format_size(elements * 4):>10} {name:>9} {median * 1e3:>10.3f} {algbw:>11.3f} "
                    f"{record['busbw_GBps']:>11.3f} {record['speedup_vs_gloo']:>7.2f}x {'yes' if correct else 'NO':>3}",
                    flush=True,
                )
    if rank == 0:
        environment = {
            "torch": torch.__version__,
            "fairring": fairring.build_info(),
            "python": platform.python_version(),
            "host": platform.node(),
            "cpus": os.cpu_count(),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"environment": environment, "records": records}, indent=1))
        print(f"wrote {args.json}")
    dist.destroy_process_group()
    if not all(record["correct"] for record in records):
        sys.exit("fairring.bench: some all_reduce results were wrong")


if __name__ == "__main__":
    main(sys.argv[1:])
