"""What a process group costs to create: time, threads, memory, file descriptors.

Four ranks on loopback, as 2 machines x 2 ranks (FAIRRING_MACHINE_ID), create
--groups subgroups over all ranks with each backend and report, per group and
per rank, the creation time and what it added to the process. Rank 0 prints:

    python benchmarks/group_cost.py [--groups 4] [--all-reduce]

--all-reduce adds one 1 MiB CPU all-reduce in each group, after creation, and
reports what that added too (the engine's share).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
RANKS_PER_MACHINE = 2


def process_usage() -> dict[str, float]:
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    return {
        "threads": float(status["Threads"].strip()),
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
        "virtual_mib": int(status["VmSize"].split()[0]) / 1024,
        "fds": float(len(os.listdir("/proc/self/fd"))),
    }


def measure(backend: str, groups: int, all_reduce: bool) -> dict[str, float]:
    before = process_usage()
    start = time.perf_counter()
    made = [dist.new_group(backend=backend) for _ in range(groups)]
    created = time.perf_counter()
    after = process_usage()
    result = {"init_ms": (created - start) * 1000 / groups}
    result.update({key: (after[key] - before[key]) / groups for key in before})
    if all_reduce:
        tensor = torch.ones(256 * 1024)
        start = time.perf_counter()
        for group in made:
            dist.all_reduce(tensor, group=group)
        result["first_all_reduce_ms"] = (time.perf_counter() - start) * 1000 / groups
        used = process_usage()
        result.update({f"{key}_after_all_reduce": (used[key] - after[key]) / groups for key in used})
    dist.barrier()
    for group in made:
        dist.destroy_process_group(group)
    return result


def rank_main(rank: int, port: int, groups: int, all_reduce: bool, queue: mp.Queue) -> None:
    os.environ["FAIRRING_MACHINE_ID"] = f"machine{rank // RANKS_PER_MACHINE}"
    os.environ["LOCAL_RANK"] = str(rank % RANKS_PER_MACHINE)
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import fairring  # noqa: F401

    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("fairring", store=store, rank=rank, world_size=WORLD)
    results = {backend: measure(backend, groups, all_reduce) for backend in ("gloo", "fairring")}
    queue.put((rank, results))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--all-reduce", action="store_true")
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [
        context.Process(target=rank_main, args=(rank, port, args.groups, args.all_reduce, queue))
        for rank in range(WORLD)
    ]
    for process in processes:
        process.start()
    results = dict(queue.get(timeout=300) for _ in processes)
    for process in processes:
        process.join(timeout=60)
    print(f"per group, median over {WORLD} ranks ({args.groups} groups each, 2 machines x 2 ranks, loopback):")
    keys = list(results[0]["gloo"])
    print(f"{'':28}" + "".join(f"{backend:>12}" for backend in ("gloo", "fairring")))
    for key in keys:
        values = [statistics.median(results[r][backend][key] for r in results) for backend in ("gloo", "fairring")]
        print(f"{key:28}" + "".join(f"{value:12.1f}" for value in values))


if __name__ == "__main__":
    main()
