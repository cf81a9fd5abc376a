"""fairring's all_reduce microbenchmark, against Gloo (CPU) or NCCL (CUDA) in the same run.

Ranks run on local processes that emulate machines: each machine is its own
torchrun agent (`--nnodes M --node-rank i`), so ranks learn their machine from
torchrun's GROUP_RANK exactly as on a cluster. With --link (or --netns), each
machine is also a separate host: a network namespace with its own NIC, shaped
to the given rate, so that the network rather than this machine's CPUs bounds
the run, as on a real cluster.

    python -m fairring.bench                                   # 2 machines x 2 ranks, 4 KiB .. 16 MiB
    python -m fairring.bench --hosts 2 --ranks-per-host 2 --link 1gbit -b 1MiB -e 100MiB -f 10
    python -m fairring.bench --link 1gbit --study overlap      # 64 x 25 MiB, 1/2/4/8 slices in flight
    python -m fairring.bench --link 1gbit --study scaling --hosts 4

Studies: single (one all-reduce per size), overlap (many buckets back to back,
with staging sized for 1, 2, 4, 8 slices in flight), scaling (the same
all-reduce over 1, 2, ... machines), all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fairring.config import ConfigError, parse_size

from . import free_port
from .netns import Host, NetnsCluster, netns_available, rate_bytes_per_second

MASTER_PORT_IN_NAMESPACE = 29500


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fairring.bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Sizes accept units (4KiB, 25MiB, 1GiB). Records go to --json, one per measurement.",
    )
    parser.add_argument("--machines", "--hosts", type=int, default=2, help="emulated machines (default 2)")
    parser.add_argument(
        "--ranks-per-machine", "--ranks-per-host", type=int, default=2, help="ranks per machine (default 2)"
    )
    parser.add_argument("-b", "--begin", default="4KiB", help="smallest size (default 4KiB)")
    parser.add_argument("-e", "--end", default="16MiB", help="largest size (default 16MiB)")
    parser.add_argument("-f", "--factor", type=int, default=8, help="size multiplier between steps (default 8)")
    parser.add_argument("--sizes", help="explicit comma-separated sizes, instead of -b/-e/-f")
    parser.add_argument("-n", "--iters", type=int, default=5, help="timed iterations per size (default 5)")
    parser.add_argument("-w", "--warmup", type=int, default=2, help="untimed iterations first (default 2)")
    parser.add_argument("--link", help="shape each host's NIC to this tc rate (e.g. 1gbit); implies --netns")
    parser.add_argument("--netns", action="store_true", help="run each machine as a host in a network namespace")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="VAR=VALUE",
        help="environment for the ranks, e.g. FAIRRING_SLICE_SIZE=4MiB",
    )
    parser.add_argument("--study", default="single", choices=("single", "overlap", "scaling", "all"))
    parser.add_argument("--buckets", type=int, default=64, help="overlap: buckets per measurement (default 64)")
    parser.add_argument("--bucket-size", default="25MiB", help="overlap: bucket size (default 25MiB)")
    parser.add_argument("--inflight", default="1,2,4,8", help="overlap: slices in flight to try (default 1,2,4,8)")
    parser.add_argument("--scaling-size", default="64MiB", help="scaling: all-reduce size (default 64MiB)")
    parser.add_argument("--json", type=Path, default=Path("bench-results/allreduce.json"), help="records file")
    parser.add_argument("--plots", type=Path, default=Path("bench-results"), help="folder for PNG and SVG plots")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before the run is killed (default 900)")
    args = parser.parse_args(argv)
    if min(args.machines, args.ranks_per_machine, args.iters, args.factor - 1) < 1 or args.warmup < 0:
        parser.error("--machines, --ranks-per-machine and --iters must be >= 1, --factor >= 2, --warmup >= 0")
    try:
        args.size_list = size_list(args)
        args.bucket_bytes = parse_size("--bucket-size", args.bucket_size)
        args.scaling_bytes = parse_size("--scaling-size", args.scaling_size)
        args.inflight_list = [int(k) for k in args.inflight.split(",")]
        if args.link:
            rate_bytes_per_second(args.link)
    except (ConfigError, ValueError) as error:
        parser.error(str(error))
    if min(args.inflight_list) < 1 or args.buckets < 1:
        parser.error("--inflight values and --buckets must be at least 1")
    for assignment in args.set:
        if "=" not in assignment:
            parser.error(f"--set takes VAR=VALUE, not {assignment!r}")
    args.netns = args.netns or bool(args.link)
    if args.netns:
        available, reason = netns_available()
        if not available:
            parser.error(f"--link/--netns need network namespaces, which are unavailable here: {reason}")
    return args


def size_list(args: argparse.Namespace) -> list[int]:
    if args.sizes:
        return [parse_size("--sizes", text) for text in args.sizes.split(",")]
    begin, end = parse_size("--begin", args.begin), parse_size("--end", args.end)
    if begin > end:
        raise ConfigError(f"--begin ({args.begin}) is larger than --end ({args.end})")
    sizes = [begin]
    while sizes[-1] * args.factor <= end:
        sizes.append(sizes[-1] * args.factor)
    return sizes


@dataclass(frozen=True)
class Run:
    """One launch of the ranks: a study's measurements under one set of settings."""

    study: str
    machines: int
    sizes: list[int]
    buckets: int = 1
    inflight: int = 0
    environment: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        extra = f", {self.inflight} slice(s) in flight" if self.inflight else ""
        return f"{self.study}: {self.machines} machine(s){extra}"


def runs_for(args: argparse.Namespace) -> list[Run]:
    user_env = dict(assignment.split("=", 1) for assignment in args.set)
    studies = ("single", "overlap", "scaling") if args.study == "all" else (args.study,)
    runs = []
    if "single" in studies:
        runs.append(Run("single", args.machines, args.size_list, environment=user_env))
    if "overlap" in studies:
        from fairring import _C
        from fairring.config import load_config

        # The buckets' own slice size becomes the maximum, so that init's check
        # (staging for one full slice) asks for no more than the buckets need. This keeps the
        # buckets' slicing as it is for buckets of 2+ maximum slices (the 25 MiB default).
        max_slice = load_config({**os.environ, **user_env}).slice_size
        slice_bytes = min(args.bucket_bytes, _C.slice_bytes_for(args.bucket_bytes, max_slice))
        per_slice = _C.staging_bytes_for(slice_bytes, args.ranks_per_machine, args.machines, padded=False)
        # Init asks for room for one padded slice, which is less than two unpadded ones.
        at_least = _C.staging_bytes_for(slice_bytes, args.ranks_per_machine, args.machines, padded=True)
        for inflight in args.inflight_list:
            environment = {
                **user_env,
                "FAIRRING_SLICE_SIZE": str(slice_bytes),
                "FAIRRING_TOTAL_MEMORY": str(max(inflight * per_slice, at_least)),
            }
            runs.append(Run("overlap", args.machines, [args.bucket_bytes], args.buckets, inflight, environment))
    if "scaling" in studies:
        for machines in range(1, args.machines + 1):
            runs.append(Run("scaling", machines, [args.scaling_bytes], environment=user_env))
    return runs


@contextlib.contextmanager
def hosts_for(args: argparse.Namespace, machines: int) -> Iterator[list[Host] | None]:
    if not args.netns:
        yield None
        return
    with NetnsCluster(machines, rate=args.link) as cluster:
        yield cluster.hosts


def agent_command(args: argparse.Namespace, run: Run, node: int, master: str, port: int, output: Path) -> list[str]:
    worker_args = ["--sizes", ",".join(str(s) for s in run.sizes), "--study", run.study]
    worker_args += ["--buckets", str(run.buckets), "--inflight", str(run.inflight)]
    worker_args += ["--iters", str(args.iters), "--warmup", str(args.warmup), "--json", str(output)]
    if args.link:
        worker_args += ["--link", args.link, "--link-bytes-per-s", str(rate_bytes_per_second(args.link))]
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={run.machines}", f"--node-rank={node}", f"--nproc-per-node={args.ranks_per_machine}",
        f"--master-addr={master}", f"--master-port={port}",
        "-m", "fairring.bench.worker", *worker_args,
    ]  # fmt: skip


def run_agents(args: argparse.Namespace, run: Run, hosts: list[Host] | None, output: Path) -> int:
    environment = {**os.environ, **run.environment}
    if hosts is None:
        master, port = "127.0.0.1", free_port()
        # Emulated machines share this host: keep every path on loopback.
        environment.setdefault("TP_SOCKET_IFNAME", "lo")
        environment.setdefault("GLOO_SOCKET_IFNAME", "lo")
    else:
        master, port = hosts[0].address, MASTER_PORT_IN_NAMESPACE
        environment.update(TP_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0")
    agents: list[subprocess.Popen[bytes]] = []
    logs: list[tempfile._TemporaryFileWrapper[bytes] | None] = []
    try:
        for node in range(run.machines):
            command = agent_command(args, run, node, master, port, output)
            if hosts is not None:
                command = ["ip", "netns", "exec", hosts[node].name, *command]
            # Machine 0's rank 0 prints progress; the other agents log to files, shown on failure.
            log = None if node == 0 else tempfile.TemporaryFile()
            logs.append(log)
            agents.append(subprocess.Popen(command, stdout=log, stderr=log, env=environment, start_new_session=True))
        return wait_for(agents, logs, args.timeout)
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()


def wait_for(agents: list[subprocess.Popen[bytes]], logs: list, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while any(agent.poll() is None for agent in agents):
        if any(agent.returncode not in (None, 0) for agent in agents) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    codes = [agent.poll() for agent in agents]
    if all(code == 0 for code in codes):
        return 0
    failed = {node: code for node, code in enumerate(codes) if code not in (None, 0)}
    reason = f"the agents of machines {failed} exited with those codes" if failed else f"timed out after {timeout:g} s"
    print(f"fairring.bench: the run failed ({reason})", file=sys.stderr)
    for node, log in enumerate(logs):
        if log is not None:
            log.seek(0)
            print(f"--- machine {node} ---\n{log.read().decode(errors='replace')[-4000:]}", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    records: list[dict] = []
    environment: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        for index, run in enumerate(runs_for(args)):
            print(f"== {run.describe()}", flush=True)
            output = Path(scratch) / f"run{index}.json"
            with hosts_for(args, run.machines) as hosts:
                status = run_agents(args, run, hosts, output)
            if status != 0:
                return status
            result = json.loads(output.read_text())
            environment = result["environment"]
            records += result["records"]
    command = ["python", "-m", "fairring.bench", *argv]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"command": command, "environment": environment, "records": records}, indent=1))
    print(f"records: {args.json}")
    from .plots import plot_records

    for path in plot_records(records, args.plots, title_suffix=f", NICs at {args.link}" if args.link else ""):
        print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
