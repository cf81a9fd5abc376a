"""Threads and CPU time per rank, idle and busy, on the emulated device (`make rank-threads`).

Issue 62 asks what a rank costs at 8 ranks a machine: the engine's stage threads and their
device-wait polls, the completion workers, the rails' loop, the inner groups' workers. This runs
2 machines x 8 ranks (by default) on the emulated device, whose streams are worker threads as a
GPU's would be host threads of the engine; each rank makes its engine with one all-reduce, then
reports its threads and CPU time over an idle window (nothing in flight), then over a busy one
(all-reduces back to back, each checked), then its threads after an idle window again (the
completion workers beyond the first leave after 2 s). The engine launches ahead, as a CUDA engine
does by default (FAIRRING_CUDA_WAIT=stream: its follower thread and the device's signal waits
counted); `--host-waits` measures the engine that launches each step when the network delivered.
On CPU ranks share the machine's cores, so the busy figures are a share of those; the idle ones
are what a rank burns while it waits for the next step, which should be near zero.

    python benchmarks/rank_threads.py                  # 2 x 8, 3 s idle windows
    python benchmarks/rank_threads.py --layout 2x2 --idle-s 2 --host-waits
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import InitSpec, Layout, RankPool, wait_for_emulated_callers_stream
from benchmarks.reference import all_ranks_reduced, assert_matches, rank_tensor

# Gloo local steps (the emulated NCCL), slices of 256 KiB, no jitter: the engine's own cost.
ENV = {
    "FAIRRING_SHM_DISABLE": "1",
    "FAIRRING_SLICE_SIZE": "256KiB",
    "FAIRRING_RAILS_TRANSPORT": "tensorpipe",
}
LAUNCHING_AHEAD = "seed=1,jitter_us=0,caller_stream"  # the caller's stream waits, not the host
HOST_WAITS = "seed=1,jitter_us=0"
NUMEL = 1 << 20  # 4 MiB of float32: 16 slices


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def thread_names() -> dict[str, int]:
    """This process's threads by name (what the kernel keeps: 15 characters)."""
    names: dict[str, int] = {}
    for task in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{task}/comm").read_text().strip()
        except OSError:  # it left meanwhile
            continue
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items(), key=lambda item: (-item[1], item[0])))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(idle_s: float, busy_ops: int) -> tuple[dict[str, float], dict[str, int]]:
    """One rank's threads and CPU per wall second: made, idle, busy, idle again; its threads by name."""
    rank = dist.get_rank()
    tensor = rank_tensor(rank, (NUMEL,), torch.float32, seed=1)
    dist.all_reduce(tensor)  # the engine, made
    wait_for_emulated_callers_stream()
    assert_matches(tensor, all_ranks_reduced((NUMEL,), torch.float32, seed=1))
    figures: dict[str, float] = {"threads_made": threads()}
    dist.barrier()
    start_wall, start_cpu = time.monotonic(), cpu_seconds()
    time.sleep(idle_s)
    figures["idle_cpu_per_s"] = (cpu_seconds() - start_cpu) / (time.monotonic() - start_wall)
    figures["threads_idle"] = threads()
    dist.barrier()
    start_wall, start_cpu = time.monotonic(), cpu_seconds()
    peak = 0
    for op in range(busy_ops):
        tensor = rank_tensor(rank, (NUMEL,), torch.float32, seed=2 + op)
        work = dist.all_reduce(tensor, async_op=True)
        peak = max(peak, threads())
        work.wait()
        wait_for_emulated_callers_stream()
        assert_matches(tensor, all_ranks_reduced((NUMEL,), torch.float32, seed=2 + op))
    figures["busy_cpu_per_s"] = (cpu_seconds() - start_cpu) / (time.monotonic() - start_wall)
    figures["busy_wall_s"] = time.monotonic() - start_wall
    figures["threads_busy_peak"] = peak
    dist.barrier()
    time.sleep(idle_s)
    figures["threads_after"] = threads()
    return figures, thread_names()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--layout", default="2x8", help="machines x ranks per machine (default 2x8)")
    parser.add_argument("--idle-s", type=float, default=3.0, help="each idle window, seconds (default 3)")
    parser.add_argument("--busy-ops", type=int, default=8, help="4 MiB all-reduces in the busy window (default 8)")
    parser.add_argument(
        "--host-waits", action="store_true", help="the engine launches each step when the network delivered"
    )
    args = parser.parse_args(argv)
    machines, local = (int(part) for part in args.layout.split("x"))
    device = HOST_WAITS if args.host_waits else LAUNCHING_AHEAD
    spec = InitSpec(extra_env={**ENV, "FAIRRING_TEST_EMULATED_DEVICE": device})
    with RankPool(Layout(machines, local), spec) as ranks:
        outcomes = ranks.run(measure, args.idle_s, args.busy_ops, timeout=600)
    how = "the host waits" if args.host_waits else "launching ahead"
    print(f"{args.layout} on the emulated device ({how}), {os.cpu_count()} CPUs, {args.busy_ops} all-reduces of 4 MiB:")
    print("figure (per rank)             min      median   max")
    for key in outcomes[0][0]:
        values = [figures[key] for figures, _ in outcomes]
        print(f"{key:26} {min(values):9.3f} {statistics.median(values):9.3f} {max(values):9.3f}")
    print("rank 0's threads at the end, by name:", ", ".join(f"{name} {n}" for name, n in outcomes[0][1].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
