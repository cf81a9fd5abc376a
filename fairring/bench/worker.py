"""One rank of a benchmark run, started by torchrun (see fairring.bench.__main__).

For each collective (--collective: all_reduce, reduce_scatter, all_gather, or
several in turn; fairring.bench.collectives) and size, times it on the baseline group (Gloo for CPU
tensors, NCCL for CUDA) and on fairring over the same ranks, checks each result
against the closed-form value of known inputs, and has rank 0 print a progress
line and write one JSON record per measurement.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

import fairring
from fairring._config import FLAT_THRESHOLD, SLICES_IN_FLIGHT, Config, load_config
from fairring._sizes import format_size, parse_size

from .collectives import COLLECTIVES, Buffers, Collective
from .shared_gpu import default_shared_gpu_env

COLUMNS = (
    ("size", 10),
    ("backend", 13),
    ("median ms", 10),
    ("algbw GB/s", 11),
    ("busbw GB/s", 11),
    ("vs base", 8),
    ("of bound", 9),
    ("link busy", 10),
    ("cpu busy", 9),
    ("ok", 3),
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", required=True, help="comma-separated sizes")
    parser.add_argument("--iters", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--link-bytes-per-s", type=float, default=0.0, help="shaped NIC rate; 0: unshaped")
    parser.add_argument("--link", default="", help="the NIC rate as given, for the records")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument(
        "--study", default="single", choices=("single", "overlap", "scaling", "transports", "dispatch", "compare")
    )
    # As the launcher checked it: one of COLLECTIVES, or several, comma-separated, timed in turn.
    parser.add_argument("--collective", default="all_reduce", type=lambda text: text.split(","))
    parser.add_argument("--buckets", type=int, default=1, help="ops issued back to back per measurement")
    parser.add_argument(
        "--inflight", type=int, default=0, help="slices the staging memory allows in flight, for records"
    )
    return parser.parse_args(argv)


def shaper_bytes(shaped: bool) -> int:
    """Bytes this emulated host's NIC shaper has sent (read by local rank 0 only; the others get 0).

    The tbf qdisc on the host's eth0 (fairring.bench.netns) charges every frame's headers, one set
    per TCP segment even inside a GSO packet, so these are the bytes the rate limits, which the NIC's
    own tx_bytes (headers once per GSO packet) undercounts. Off the shaped hosts eth0 is the
    machine's and is not read.
    """
    if not shaped or int(os.environ.get("LOCAL_RANK", 0)) != 0:
        return 0
    shown = subprocess.run(
        ["tc", "-s", "-j", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True, check=True
    ).stdout
    return sum(int(qdisc["bytes"]) for qdisc in json.loads(shown) if qdisc.get("root"))


def nic_mtu(shaped: bool) -> int | None:
    """The MTU of this host's eth0 on the emulated hosts, as the kernel has it; None elsewhere."""
    if not shaped:
        return None
    shown = subprocess.run(["ip", "-j", "link", "show", "dev", "eth0"], capture_output=True, text=True, check=True)
    return int(json.loads(shown.stdout)[0]["mtu"])


def time_ops(
    collective: Collective,
    every: list[Buffers],
    group: dist.ProcessGroup,
    barrier_group: dist.ProcessGroup,
    iters: int,
    warmup: int,
) -> list[float]:
    """Seconds to run the collective on every buffer, issued back to back like DDP's buckets, per iteration."""
    seconds = []
    for iteration in range(warmup + iters):
        dist.barrier(group=barrier_group)
        start = time.perf_counter()
        works = [collective.issue(buffers, group) for buffers in every]
        for work in works:
            work.wait()
        if every[0][0].is_cuda:
            torch.cuda.synchronize()
        if iteration >= warmup:
            seconds.append(time.perf_counter() - start)
    return seconds


AUTO_NAME = "fairring-auto"


@dataclass
class Timed:
    """One group's measurements at one size: each timed iteration, and what its ops cost in all."""

    seconds: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    sent: int = 0


def passes(names: list[str], iters: int, warmup: int, alternate: bool) -> list[tuple[list[str], int, int]]:
    """The order the groups are timed in: (groups, timed iterations, warm-up iterations) per pass.

    Alternated, each iteration times every group once, starting one later each time, so that a drift
    of the machine (its clocks, its other processes, a GPU shared without MPS) falls on all alike;
    otherwise each group's iterations run together, one group after the other.
    """
    if not alternate:
        return [([name], iters, warmup) for name in names]
    return [
        (names[index % len(names) :] + names[: index % len(names)], int(index >= warmup), int(index < warmup))
        for index in range(warmup + iters)
    ]


def time_groups(
    groups: dict[str, dist.ProcessGroup],
    collective: Collective,
    every: list[Buffers],
    gloo: dist.ProcessGroup,
    args: argparse.Namespace,
    shaped: bool,
) -> dict[str, Timed]:
    """Every group's timed ops on `every` buffer, in passes()'s order."""
    timed = {name: Timed() for name in groups}
    for order, iters, warmup in passes(list(groups), args.iters, args.warmup, args.study == "compare"):
        for name in order:
            sent_before, cpu_before, wall_before = shaper_bytes(shaped), time.process_time(), time.perf_counter()
            timed[name].seconds += time_ops(collective, every, groups[name], gloo, iters, warmup)
            timed[name].cpu_s += time.process_time() - cpu_before
            timed[name].wall_s += time.perf_counter() - wall_before
            timed[name].sent += shaper_bytes(shaped) - sent_before
    return timed


def first_auto_use(
    groups: dict[str, dist.ProcessGroup], device: torch.device | None, collective: Collective
) -> dict[str, object]:
    """The dispatch and compare studies: a group with FAIRRING_FLAT_THRESHOLD=auto (its CUDA engine on,
    as FAIRRING_CUDA_ENGINE=auto does), made at its first call, its first op of the kind timed (which
    measures that kind, apart from the others), and what it decided."""
    if AUTO_NAME not in groups:
        options = fairring.Options(engine=True, flat_threshold="auto")
        groups[AUTO_NAME] = dist.new_group(backend="fairring", pg_options=options)
    group = groups[AUTO_NAME]
    start = time.perf_counter()
    collective.issue(collective.buffers(4096, dist.get_world_size(), device), group).wait()
    measure_s = time.perf_counter() - start
    backend = fairring.backend_of(group, device or "cpu")
    decided = backend.measured_threshold(device.type if device else "cpu", collective.name)
    return {
        "auto_threshold": decided["threshold"],
        "auto_ceiling": decided["ceiling"],
        "auto_reason": decided["reason"],
        "auto_sizes": decided["sizes"],
        "auto_measure_s": measure_s,
    }


def environment(device_type: str) -> dict[str, object]:
    config = load_config(os.environ)
    flat = config.cuda_flat_threshold if device_type == "cuda" else config.cpu_flat_threshold
    return {
        "torch": torch.__version__,
        "fairring": fairring.build_info(),
        "python": platform.python_version(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "fairring_env": {
            k: v for k, v in os.environ.items() if k.startswith(("FAIRRING_", "TP_SOCKET", "GLOO_SOCKET"))
        },
        # What shaped the plans, defaults included (the variables above name only what was set).
        "fairring_settings": {**config.must_agree(), FLAT_THRESHOLD: flat, SLICES_IN_FLIGHT: config.slices_in_flight},
        # Rules of the plan that no setting names, for the model (fairring/bench/model.py) to mirror.
        "fairring_plan": {"shortest_slice": fairring._C.slice_bytes_for(0, config.slice_size)},
    }


# prctl(2): have the kernel send this signal when the parent dies.
PR_SET_PDEATHSIG = 1


def rank_device() -> torch.device | None:
    """This rank's GPU, made current, or None where there is none; call before any NCCL group exists.

    The bench's machines are emulated on this host, so its ranks share its GPUs
    (LOCAL_RANK's, round robin). Where two ranks get one GPU, each process is
    its own NCCL host (NCCL_HOSTID), as NCCL refuses two ranks of one host on
    one GPU and then connects them through its socket transport
    (docs/design.md, "One GPU, several processes").
    """
    if not torch.cuda.is_available():
        return None
    gpus = torch.cuda.device_count()
    if gpus < int(os.environ.get("WORLD_SIZE", 1)):
        # The host id only: launch.py gives NCCL its network (loopback, or the emulated hosts' NIC).
        default_shared_gpu_env(os.environ, os.environ.get("RANK", 0), "fairring-bench-rank", loopback=False)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % gpus)
    torch.cuda.set_device(device)
    return device


def die_with_the_agent() -> None:
    """torchrun starts each rank in a session of its own: have the kernel kill the rank if its agent
    dies (killed by the bench on a time-out, say), rather than leave it running with no one to stop
    it."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the agent died before the request took effect
        sys.exit("fairring.bench.worker: the torchrun agent is gone")


def rails_description(config: Config) -> str:
    """What carried the rails, for the records: "TensorPipe" or "NIXL/UCX"."""
    if config.rails_transport == "nixl":
        return f"NIXL/{config.nixl_backend}"
    return "TensorPipe"


def time_collective(
    collective: Collective,
    groups: dict[str, dist.ProcessGroup],
    fairring_name: str,
    gloo: dist.ProcessGroup,
    device: torch.device | None,
    args: argparse.Namespace,
    cores: int,
    mtu: int | None,
) -> list[dict[str, object]]:
    """One collective's records at every size: each group's times, the profile, and the check."""
    rank, size = dist.get_rank(), dist.get_world_size()
    measures = args.study == "compare" or (args.study == "dispatch" and collective.name == "all_reduce")
    auto = first_auto_use(groups, device, collective) if measures else {}
    topology = dist.group.WORLD._get_backend(torch.device("cpu")).topology
    shaped = args.link_bytes_per_s > 0
    config = load_config(os.environ)
    baseline_name = "nccl" if device is not None else "gloo"
    if rank == 0:
        where = f"CUDA ({torch.cuda.get_device_name(device)})" if device is not None else "CPU"
        link = f", NICs shaped to {args.link} (MTU {mtu})" if args.link else ""
        what = f"{where} float32 {collective.name}"
        print(f"{topology.num_machines} machines x {topology.local_size} ranks, {what}{link}")
        print(" ".join(f"{name:>{width}}" for name, width in COLUMNS), flush=True)
    records: list[dict[str, object]] = []
    for size_text in args.sizes.split(","):
        every = [collective.buffers(parse_size("--sizes", size_text), size, device) for _ in range(args.buckets)]
        nbytes = max(every[0][0].nbytes, every[0][1].nbytes)
        total_bytes = nbytes * args.buckets
        bound = collective.bound_s(total_bytes, topology.num_machines, args.link_bytes_per_s)
        medians: dict[str, float] = {}
        correct = {name: collective.check(every, group) for name, group in groups.items()}
        timed = time_groups(groups, collective, every, gloo, args, shaped)
        for name in groups:
            seconds, cpu_s, wall_s, sent = timed[name].seconds, timed[name].cpu_s, timed[name].wall_s, timed[name].sent
            # An op is as slow as its slowest rank.
            slowest = torch.tensor(seconds, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=gloo)
            per_iter = slowest.tolist()
            median = statistics.median(per_iter)
            # Profile: what the busiest host's shaper passed per op (frames: headers and ACKs
            # included), and how busy the cores were (every rank's threads).
            maxima = torch.tensor([sent, wall_s], dtype=torch.float64)
            dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=gloo)
            busiest, wall_max = maxima.tolist()
            cpu_total = torch.tensor([cpu_s], dtype=torch.float64)
            dist.all_reduce(cpu_total, group=gloo)
            wire_bytes = busiest / (args.warmup + args.iters) if shaped else None
            medians[name] = median
            algbw = total_bytes / median / 1e9
            record = {
                "study": args.study,
                "collective": collective.name,
                "backend": name,
                "rails": rails_description(config) if name == fairring_name else None,
                "baseline": baseline_name,
                "bytes": nbytes,
                "buckets": args.buckets,
                "inflight": args.inflight or None,
                "dtype": "float32",
                "device": "cuda" if device is not None else "cpu",
                "machines": topology.num_machines,
                "ranks_per_machine": topology.local_size,
                "link": args.link or None,
                "mtu": mtu,
                "iters": args.iters,
                "warmup": args.warmup,
                "seconds": per_iter,
                "median_s": median,
                "min_s": min(per_iter),
                "max_s": max(per_iter),
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * collective.bus_factor(size),
                "speedup_vs_baseline": medians[baseline_name] / median,
                "bound_s": bound,
                "fraction_of_bound_speed": bound / median if bound else None,
                "wire_bytes": wire_bytes,
                "link_busy": wire_bytes / args.link_bytes_per_s / median if wire_bytes else None,
                "cpu_busy": float(cpu_total) / (wall_max * cores),
                "correct": correct[name],
                "alternated": args.study == "compare",
                **(auto if name == AUTO_NAME else {}),
            }
            records.append(record)
            if rank == 0:
                print_row(record)
    return records


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    die_with_the_agent()
    device = rank_device()
    dist.init_process_group("fairring")
    rank, size = dist.get_rank(), dist.get_world_size()
    baseline_name = "nccl" if device is not None else "gloo"
    gloo = dist.new_group(backend="gloo")
    config = load_config(os.environ)
    # Named by transport where it is not the default, so one table can hold both.
    fairring_name = "fairring" if config.rails_transport == "tensorpipe" else f"fairring-{config.rails_transport}"
    groups = {baseline_name: dist.new_group(backend=baseline_name) if device else gloo, fairring_name: dist.group.WORLD}
    # The cores the ranks share: one machine's for emulated hosts (one kernel, one hostname),
    # every machine's on a real cluster.
    hostnames: list[str | None] = [None] * size
    dist.all_gather_object(hostnames, platform.node(), group=gloo)
    cores = (os.cpu_count() or 1) * len(set(hostnames))
    records = []
    shaped = args.link_bytes_per_s > 0
    mtu = nic_mtu(shaped)
    for name in args.collective:
        records += time_collective(COLLECTIVES[name], groups, fairring_name, gloo, device, args, cores, mtu)
    if rank == 0:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"environment": environment("cuda" if device is not None else "cpu"), "records": records}
        args.json.write_text(json.dumps(document, indent=1))
    dist.destroy_process_group()
    if not all(record["correct"] for record in records):
        sys.exit(f"fairring.bench: some {', '.join(args.collective)} results were wrong")


def print_row(record: dict[str, object]) -> None:
    bound = record["fraction_of_bound_speed"]
    size = format_size(int(record["bytes"]))
    cells = [
        f"{record['buckets']}x{size}" if int(record["buckets"]) > 1 else size,
        str(record["backend"]),
        f"{float(record['median_s']) * 1e3:.3f}",
        f"{float(record['algbw_GBps']):.3f}",
        f"{float(record['busbw_GBps']):.3f}",
        f"{float(record['speedup_vs_baseline']):.2f}x",
        f"{float(bound) * 100:.0f}%" if bound else "-",
        f"{float(record['link_busy']) * 100:.0f}%" if record.get("link_busy") else "-",
        f"{float(record['cpu_busy']) * 100:.0f}%",
        "yes" if record["correct"] else "NO",
    ]
    print(" ".join(f"{cell:>{width}}" for cell, (_, width) in zip(cells, COLUMNS, strict=True)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
