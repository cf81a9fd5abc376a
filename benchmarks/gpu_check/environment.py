"""The environment stage (python, torch, CUDA, NCCL, the compiler, nvcc, the GPUs) and the build's."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import shutil
import sys
from typing import Any

import torch

import fairring

from .processes import run_bounded
from .stage import Stage, tail


def nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # a CPU build of torch has no NCCL
        return None
    return ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)


def version_line(command: list[str], last: bool = False) -> str:
    """A tool's version line (its first, or its last), "none" where it is missing, never an exception."""
    if shutil.which(command[0]) is None:
        return "none"
    finished = run_bounded(command, 30)
    lines = finished.output.strip().splitlines()
    if finished.returncode != 0 or not lines:
        return f"failed: {finished.output.strip()[:200]}"
    return lines[-1] if last else lines[0]


def environment() -> dict[str, Any]:
    # make gpu-check exports CXX and the CUDA_HOME it derived from nvcc, and built with them.
    compiler = shlex.split(os.environ.get("CXX") or "c++")
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "cpus": os.cpu_count(),
        "nproc": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_home": os.environ.get("CUDA_HOME") or "none",
        "compiler": f"{shlex.join(compiler)}: {version_line([*compiler, '--version'])}",
        "nvcc": version_line(["nvcc", "--version"], last=True),
        "nccl": nccl_version(),
        "fairring": fairring.__version__,
        "fairring_build": fairring.build_info(),
        "cuda_available": torch.cuda.is_available(),
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "environment": {k: v for k, v in os.environ.items() if k.startswith(("FAIRRING_", "CUDA", "NCCL_", "TP_"))},
    }
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_mode", "--format=csv,noheader"]
        finished = run_bounded(query, 30)
        info["nvidia_smi"] = finished.output.strip() if finished.returncode == 0 else f"failed: {finished.output}"
    return info


def gpu_names() -> list[str]:
    """Called after the stages, so that this process holds no CUDA context while they run."""
    try:
        return [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
    except Exception as error:
        return [f"unavailable: {error}"]


def build_stage(args: argparse.Namespace) -> Stage:
    stage = Stage("build", commands=[args.build_command] if args.build_command else [])
    if args.build_log is None:
        stage.detail = "not run by this command (make gpu-check builds first)"
        return stage
    stage.status, stage.seconds = "ok", args.build_seconds or 0.0
    stage.output_tail = tail(args.build_log.read_text(errors="replace")) if args.build_log.exists() else ""
    built = fairring.build_info()
    if args.device == "cuda" and not built.get("cuda_path"):
        stage.status, stage.detail = "failed", "built without the CUDA path"
    else:
        stage.detail = f"built against torch {built.get('torch')}, CUDA path: {built.get('cuda_path')}"
    return stage
