"""What counting and timing each collective for fairring.summary() costs (`make summary-cost`).

The funnel starts an interval before each all-reduce, reduce-scatter and
all-gather and counts it once launched (csrc/backend/usage.h). This prints
that cost per op, measured on its own, next to the fastest collective a job
could issue through fairring in the same run: a 4-byte all-reduce of 2 ranks
on loopback, which Gloo takes. The fraction is what the summary adds to it.
(benchmarks/delegated_cost.py compares whole delegated collectives, funnel
included, with their delegate called directly.)

    python benchmarks/summary_cost.py
    python benchmarks/summary_cost.py --ops 2000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fairring
from fairring.bench import free_port


def tiny_all_reduces(rank: int, port: int, ops: int, answer: mp.SimpleQueue) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "FAIRRING_MACHINE_ID": "one"})
    dist.init_process_group("fairring", rank=rank, world_size=2)
    tensor = torch.ones(1)
    times = []
    for _ in range(ops):
        started = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - started)
    if rank == 0:
        answer.put(statistics.median(times[ops // 10 :]))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=5000, help="all-reduces to time (the first tenth warms up)")
    args = parser.parse_args()
    per_op = min(fairring._C._testing.usage_seconds_per_op(100_000) for _ in range(5))
    answer: mp.SimpleQueue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(tiny_all_reduces, args=(free_port(), args.ops, answer), nprocs=2)
    all_reduce_s = answer.get()
    print(f"counting and timing one op:        {per_op * 1e9:8.0f} ns")
    print(f"4-byte all-reduce, 2 ranks (Gloo): {all_reduce_s * 1e9:8.0f} ns (median of {args.ops - args.ops // 10})")
    print(f"the summary's share of it:         {per_op / all_reduce_s * 100:8.2f} %")


if __name__ == "__main__":
    main()
