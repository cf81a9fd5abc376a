"""What authenticating (and encrypting) the rails costs, side by side, interleaved.

    git worktree add /tmp/unauthenticated bad3566   # the commit before the rails were authenticated
    (cd /tmp/unauthenticated && $PWD/.venv/bin/python setup.py build_ext --inplace)
    PYTHONPATH=. .venv/bin/python benchmarks/auth_cost.py --baseline /tmp/unauthenticated [--rounds 3]
    PYTHONPATH=. .venv/bin/python benchmarks/auth_cost.py --encrypt [--rounds 3]
    PYTHONPATH=. .venv/bin/python benchmarks/auth_cost.py --baseline /tmp/unauthenticated --encrypt --link 1gbit

The first compares this checkout with a build without authentication; the second, this checkout
with FAIRRING_RAILS_ENCRYPT=0 and =1; both options together run all three. Each round runs, for
each side in turn (which goes first rotates): benchmarks/group_cost.py --groups 4 --all-reduce (a
group's creation, and its first all-reduce, which makes the engine: its rails, and so every
handshake), then 4 CPU ranks, 2 machines x 2 ranks on loopback, timing engine all-reduces of 16 and
64 MiB (each result checked). Prints each figure's median over the rounds per side, and its ratio
to the first side's.

With --link RATE (e.g. 1gbit; needs root for network namespaces) a round runs instead, for each side,
`python -m fairring.bench --link RATE --sizes 16MiB,64MiB` (2 hosts x 2 ranks whose NICs tc shapes
to RATE; fairring's and Gloo's all-reduces, each checked) and takes both medians per size.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORLD, RANKS_PER_MACHINE = 4, 2
SIZES_MIB = (16, 64)
ITERATIONS = 30


def steady_rank(rank: int, port: int, queue: object) -> None:
    """One rank: warm-up, then ITERATIONS timed all-reduces per size; reports the median seconds."""
    import torch
    import torch.distributed as dist

    os.environ["FAIRRING_MACHINE_ID"] = f"machine{rank // RANKS_PER_MACHINE}"
    os.environ["LOCAL_RANK"] = str(rank % RANKS_PER_MACHINE)
    import fairring  # noqa: F401

    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("fairring", store=store, rank=rank, world_size=WORLD)
    medians = {}
    for mib in SIZES_MIB:
        numel = mib * 2**20 // 4
        tensor = torch.full((numel,), float(rank + 1))
        dist.all_reduce(tensor)  # makes the engine at the first size; warms the staging at each
        times = []
        for _ in range(ITERATIONS):
            tensor.fill_(float(rank + 1))
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
            expected = float(sum(range(1, WORLD + 1)))
            if not bool((tensor == expected).all()):
                raise AssertionError(f"rank {rank}: a {mib} MiB all-reduce is wrong")
        medians[f"all_reduce_{mib}MiB_ms"] = statistics.median(times) * 1000
    queue.put((rank, medians))  # type: ignore[attr-defined]
    dist.destroy_process_group()


def steady() -> dict[str, float]:
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=steady_rank, args=(rank, port, queue)) for rank in range(WORLD)]
    for process in processes:
        process.start()
    results = dict(queue.get(timeout=300) for _ in processes)
    for process in processes:
        process.join(timeout=60)
    # The slowest rank's median: an all-reduce is done when every rank has it.
    return {key: max(results[rank][key] for rank in results) for key in results[0]}


def printed(command: list[str], env: dict[str, str]) -> str:
    return subprocess.run(command, env=env, check=True, capture_output=True, text=True, timeout=600).stdout


def run_build(root: Path, extra_env: dict[str, str]) -> dict[str, float]:
    """group_cost.py's fairring figures and the steady timings, with `root`'s fairring imported."""
    env = {**os.environ, "PYTHONPATH": str(root), **extra_env}
    group_cost = printed([sys.executable, str(HERE / "group_cost.py"), "--groups", "4", "--all-reduce"], env)
    figures = {}
    for key in ("init_ms", "first_all_reduce_ms"):
        match = re.search(rf"^{key}\s+\S+\s+(\S+)$", group_cost, re.M)
        if match is None:
            raise RuntimeError(f"group_cost.py printed no {key}:\n{group_cost}")
        figures[f"group {key}"] = float(match[1])
    for line in printed([sys.executable, str(Path(__file__).resolve()), "--steady"], env).splitlines():
        key, value = line.rsplit(" ", 1)
        figures[key] = float(value)
    return figures


def run_bench(root: Path, extra_env: dict[str, str], link: str) -> dict[str, float]:
    """fairring's and Gloo's median all-reduce at each size over shaped NICs, with `root`'s fairring."""
    env = {**os.environ, "PYTHONPATH": str(root), **extra_env}
    sizes = ",".join(f"{mib}MiB" for mib in SIZES_MIB)
    with tempfile.TemporaryDirectory() as folder:
        records = Path(folder) / "records.json"
        command = [sys.executable, "-m", "fairring.bench", "--link", link, "--sizes", sizes, "-n", "5", "-w", "2"]
        printed([*command, "--json", str(records), "--plots", folder], env)
        figures = {}
        for record in json.loads(records.read_text())["records"]:
            if record["correct"] is not True:
                raise AssertionError(f"a wrong result: {record}")
            mib = record["bytes"] // 2**20
            figures[f"{record['backend']} {mib}MiB_ms"] = record["median_s"] * 1000
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout built in place without authentication")
    parser.add_argument("--encrypt", action="store_true", help="FAIRRING_RAILS_ENCRYPT=0 against =1 (a third side)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--link", help="time the bench over NICs shaped to this rate instead (e.g. 1gbit)")
    parser.add_argument("--steady", action="store_true", help=argparse.SUPPRESS)  # one build's timings
    args = parser.parse_args()
    if args.steady:
        for key, value in steady().items():
            print(f"{key} {value:.3f}")
        return
    sides: dict[str, tuple[Path, dict[str, str]]] = {}
    if args.baseline is not None:
        sides["unauthenticated"] = (args.baseline.resolve(), {})
    if args.encrypt:
        sides["plain" if args.baseline is None else "authenticated"] = (HERE.parent, {"FAIRRING_RAILS_ENCRYPT": "0"})
        sides["encrypted"] = (HERE.parent, {"FAIRRING_RAILS_ENCRYPT": "1"})
    elif args.baseline is not None:
        sides["authenticated"] = (HERE.parent, {})
    else:
        parser.error("give --baseline, --encrypt, or both")
    names = list(sides)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for round_index in range(args.rounds):
        # Each side goes first in turn: drift over the run falls on every side alike.
        for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
            root, extra_env = sides[name]
            runs[name].append(run_bench(root, extra_env, args.link) if args.link else run_build(root, extra_env))
            print(f"round {round_index + 1} {name}: {runs[name][-1]}", flush=True)
    where = f"NICs shaped to {args.link}" if args.link else "loopback"
    print(f"\nmedian of {args.rounds} rounds, 2 machines x 2 ranks, CPU, {where}; ratios to {names[0]}")
    print(f"{'':28}" + "".join(f"{name:>16}" for name in names) + "".join(f"{'ratio':>8}" for _ in names[1:]))
    for key in runs[names[0]][0]:
        medians = [statistics.median(run[key] for run in runs[name]) for name in names]
        ratios = "".join(f"{median / medians[0]:8.3f}" for median in medians[1:])
        print(f"{key:28}" + "".join(f"{median:16.1f}" for median in medians) + ratios)


if __name__ == "__main__":
    main()
