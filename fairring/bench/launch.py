"""Launching a benchmark's ranks: one torchrun agent per emulated machine, on its host or on loopback."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fairring._sizes import parse_rate

from . import free_port
from .netns import Host, NetnsCluster

MASTER_PORT_IN_NAMESPACE = 29500


@dataclass(frozen=True)
class Run:
    """One launch of the ranks: a study's measurements under one set of settings."""

    study: str
    machines: int
    sizes: list[int]
    buckets: int = 1
    inflight: int = 0
    environment: dict[str, str] = field(default_factory=dict)
    # Another rank program than the microbenchmark's, with its arguments (the training study's).
    worker: tuple[str, ...] = ()
    ranks_per_machine: int | None = None  # None: --ranks-per-machine

    def describe(self) -> str:
        extra = f", {self.inflight} slice(s) in flight" if self.inflight else ""
        return f"{self.study}: {self.machines} machine(s){extra}"


@contextlib.contextmanager
def hosts_for(args: argparse.Namespace, machines: int) -> Iterator[list[Host] | None]:
    if not args.netns:
        yield None
        return
    with NetnsCluster(machines, rate=args.link, mtu=args.mtu) as cluster:
        yield cluster.hosts


def agent_command(args: argparse.Namespace, run: Run, node: int, master: str, port: int, output: Path) -> list[str]:
    if run.worker:
        worker = [*run.worker, "--json", str(output)]
    else:
        worker = ["fairring.bench.worker", "--sizes", ",".join(str(s) for s in run.sizes), "--study", run.study]
        worker += ["--buckets", str(run.buckets), "--inflight", str(run.inflight), "--collective", args.collective]
        worker += ["--iters", str(args.iters), "--warmup", str(args.warmup), "--json", str(output)]
        if args.link:
            worker += ["--link", args.link, "--link-bytes-per-s", str(parse_rate(args.link))]
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={run.machines}", f"--node-rank={node}",
        f"--nproc-per-node={run.ranks_per_machine or args.ranks_per_machine}",
        f"--master-addr={master}", f"--master-port={port}",
        "-m", *worker,
    ]  # fmt: skip


def run_agents(
    args: argparse.Namespace, run: Run, hosts: list[Host] | None, output: Path, extra: dict[str, str]
) -> int:
    environment = {**os.environ, **run.environment, **extra}
    # torchrun sets 1 itself, with a banner, when it is unset; the ranks share this machine's cores anyway.
    environment.setdefault("OMP_NUM_THREADS", "1")
    if hosts is None:
        master, port = "127.0.0.1", free_port()
        # Emulated machines share this host: keep every path on loopback.
        environment.setdefault("TP_SOCKET_IFNAME", "lo")
        environment.setdefault("GLOO_SOCKET_IFNAME", "lo")
        environment.setdefault("NCCL_SOCKET_IFNAME", "lo")  # the baseline's, and the delegate's
    else:
        master, port = hosts[0].address, MASTER_PORT_IN_NAMESPACE
        environment.update(TP_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0", NCCL_SOCKET_IFNAME="eth0")
    agents: list[subprocess.Popen[bytes]] = []
    logs: list[tempfile._TemporaryFileWrapper[bytes] | None] = []
    # torchrun's agents make a torchelastic_* log directory in TMPDIR and never remove it.
    scratch = tempfile.mkdtemp(prefix="fairring-bench-agents-")
    environment["TMPDIR"] = scratch
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
        stop_agents(agents)
        shutil.rmtree(scratch, ignore_errors=True)


def stop_agents(agents: list[subprocess.Popen[bytes]], grace_s: float = 10.0) -> None:
    """SIGTERM first: torchrun then stops its ranks, which run in sessions of their own (and die with
    their agent anyway, see worker.die_with_the_agent); SIGKILL to what is left after `grace_s`."""
    running = [agent for agent in agents if agent.poll() is None]
    for agent in running:
        with contextlib.suppress(ProcessLookupError):  # it may have exited meanwhile
            os.killpg(agent.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for agent in running:
        try:
            agent.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
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
