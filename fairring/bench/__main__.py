"""Run the all_reduce microbenchmark on local processes that emulate machines.

Each emulated machine is its own torchrun agent (`--nnodes M --node-rank i`), so
ranks learn their machine from torchrun's GROUP_RANK exactly as on a cluster.

    python -m fairring.bench                      # 2 machines x 2 ranks, CPU
    python -m fairring.bench --machines 3 --sizes 1MiB,64MiB
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fairring.config import ConfigError, parse_size

DEFAULT_SIZES = "4KiB,256KiB,4MiB,32MiB"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fairring.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=2, help="emulated machines (default 2)")
    parser.add_argument("--ranks-per-machine", type=int, default=2, help="ranks on each machine (default 2)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma-separated sizes (default {DEFAULT_SIZES})")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per size (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations first (default 2)")
    parser.add_argument(
        "--json", type=Path, default=Path("bench-results/allreduce.json"), help="where to write records"
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds before the run is killed (default 600)")
    args = parser.parse_args(argv)
    if args.machines < 1 or args.ranks_per_machine < 1 or args.iters < 1 or args.warmup < 0:
        parser.error("--machines, --ranks-per-machine and --iters must be at least 1, --warmup at least 0")
    try:
        for size in args.sizes.split(","):
            parse_size("--sizes", size)
    except ConfigError as error:
        parser.error(str(error))
    return args


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    port = free_port()
    worker_args = ["--sizes", args.sizes, "--iters", str(args.iters), "--warmup", str(args.warmup)]
    worker_args += ["--json", str(args.json.resolve())]
    agents: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for node in range(args.machines):
            command = [
                sys.executable, "-m", "torch.distributed.run",
                f"--nnodes={args.machines}", f"--node-rank={node}",
                f"--nproc-per-node={args.ranks_per_machine}",
                "--master-addr=127.0.0.1", f"--master-port={port}",
                "-m", "fairring.bench.worker", *worker_args,
            ]  # fmt: skip
            # Machine 0's rank 0 prints the table; the other agents log to files.
            log = None if node == 0 else tempfile.TemporaryFile()
            logs.append(log)
            agents.append(subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True))
        deadline = time.monotonic() + args.timeout
        while any(agent.poll() is None for agent in agents):
            failed = [agent for agent in agents if agent.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        codes = [agent.poll() for agent in agents]
        if all(code == 0 for code in codes):
            return 0
        reason = "timed out" if None in codes else f"exit codes {codes}"
        print(f"fairring.bench: the run failed ({reason})", file=sys.stderr)
        for node, log in enumerate(logs):
            if log is not None:
                log.seek(0)
                print(f"--- machine {node} ---\n{log.read().decode(errors='replace')[-4000:]}", file=sys.stderr)
        return 1
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
