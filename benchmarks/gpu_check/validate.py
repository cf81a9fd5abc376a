"""The validate stage: `python -m fairring.validate` under torchrun, one agent per emulated machine."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fairring.bench import free_port
from fairring.bench.shared_gpu import NCCL_ON_LOOPBACK

from .processes import kill, read_results, run_command
from .stage import Stage, conclude, display, tail

VALIDATE_STAGE = "validate: fairring.validate on 2 machines x 2 ranks"
# -b and -e of the validate stage: a small sweep, as the stage's time limit allows.
VALIDATE_SIZES = {"cuda": ("1MiB", "16MiB"), "cpu": ("64KiB", "1MiB")}
VALIDATE_MACHINES, VALIDATE_LOCAL = 2, 2


def validate_agent(args: argparse.Namespace, node: int, port: int, out: Path) -> list[str]:
    """One torchrun agent (a machine) of the validate stage."""
    first, last = VALIDATE_SIZES[args.device]
    return [
        sys.executable, "-m", "torch.distributed.run", f"--nnodes={VALIDATE_MACHINES}", f"--node-rank={node}",
        f"--nproc-per-node={VALIDATE_LOCAL}", "--master-addr=127.0.0.1", f"--master-port={port}",
        "-m", "fairring.validate", "--device", args.device, "-b", first, "-e", last, "-f", "4",
        "-n", str(args.compare_iters), "-w", "1", "--json", str(out),
        *(["--share-gpu"] if args.device == "cuda" else []),
    ]  # fmt: skip


def wait_agents(agents: list[subprocess.Popen[bytes]], timeout: float) -> tuple[list[int | None], str]:
    """Exit codes (None: killed at the limit). Killing an agent ends its ranks: they die with it."""
    deadline = time.monotonic() + timeout
    why = ""
    for agent in agents:
        try:
            agent.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            why = f"killed after {timeout:.0f} s"
            break
    codes = [agent.poll() for agent in agents]
    for agent in agents:
        kill(agent)
    return codes, why


def run_validate(args: argparse.Namespace, timeout: float) -> tuple[Stage, dict[str, Any]]:
    """`python -m fairring.validate` as a cluster runs it: torchrun, one agent per (emulated) machine."""
    stage = Stage(VALIDATE_STAGE)
    port = free_port()
    settings = {**NCCL_ON_LOOPBACK, "TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    settings.update(assignment.split("=", 1) for assignment in args.set)
    env = {**os.environ, **settings}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "validate.json"
        commands = [validate_agent(args, node, port, out) for node in range(VALIDATE_MACHINES)]
        shown = " ".join(f"{name}={value}" for name, value in settings.items())
        stage.commands = [f"{shown} {display(command)}" for command in commands]
        print(f"gpu-check: {stage.name} (at most {timeout:.0f} s)", flush=True)
        logs = [Path(scratch) / f"agent{node}.log" for node in range(VALIDATE_MACHINES)]
        started = time.monotonic()
        agents = []
        try:
            agents = [run_command(command, env, log) for command, log in zip(commands, logs, strict=True)]
            codes, why = wait_agents(agents, timeout)
        finally:
            for agent in agents:
                kill(agent)
        stage.seconds = time.monotonic() - started
        outputs = [log.read_text(errors="replace") for log in logs]
        stage.output_tail = "\n".join(
            f"--- machine {node} (exit code {code}) ---\n{tail(output, 6000)}"
            for node, (code, output) in enumerate(zip(codes, outputs, strict=True))
        )
        document = read_results(out)
    problems = [why] if why else []
    problems += [f"machine {node}'s agent exited with code {code}" for node, code in enumerate(codes) if code]
    summary = summarize_validate(document, args.device)
    return conclude(stage, summary, problems, "every element right; " + summary.get("verdict", ""))


def summarize_validate(document: dict[str, Any] | None, device: str) -> dict[str, Any]:
    """The validate run's results by path and size, its verdict, and what is wrong with them."""
    if document is None:
        return {"problems": ["fairring.validate wrote no results"]}
    expected = {"fairring", "nccl", "fairring-engine-off"} if device == "cuda" else {"fairring", "gloo"}
    problems = [] if set(document["paths"]) == expected else [f"paths {sorted(document['paths'])}"]
    if document["wrong"]:
        problems.append(f"{document['wrong']} wrong element(s)")
    return {
        "device": device,
        "paths": {name: path["results"] for name, path in document["paths"].items()},
        "comparison": document["comparison"],
        "bound_note": document["bound_note"],
        "rails": document["rails"],
        "engine_stats": document["engine_stats"],
        "verdict": document["verdict"]["text"],
        "problems": problems,
    }
