"""Where this rank stands: torchrun's variables, or srun's mapped onto them, and its device."""

from __future__ import annotations

import contextlib
import ctypes
import re
import signal
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

import torch

from fairring.bench.shared_gpu import default_shared_gpu_env

# prctl(2): have the kernel send this signal when the parent dies.
PR_SET_PDEATHSIG = 1
# SLURM_TASKS_PER_NODE's items: "4" or "4(x3)" (4 tasks on each of 3 nodes).
_TASKS_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")
MASTER_HINT = (
    "export MASTER_ADDR (a host every rank can reach, e.g. the job's first node: "
    '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)) and MASTER_PORT (a free TCP port, '
    "e.g. 29500) before srun"
)


class LaunchError(RuntimeError):
    """The launcher's variables do not say where this rank stands; the message says what to set."""


@dataclass(frozen=True)
class Placement:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launcher: str  # "torchrun" (or any launcher that sets RANK), or "srun"


def _integer(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise LaunchError(f"{name}={environ[name]!r} is not an integer") from None


def tasks_on_node(tasks_per_node: str, node: int) -> int:
    """This node's entry of SLURM_TASKS_PER_NODE (e.g. "2(x3),1"): the node's task count."""
    counts: list[int] = []
    for item in tasks_per_node.split(","):
        match = _TASKS_ITEM.fullmatch(item.strip())
        if match is None:
            raise LaunchError(f"SLURM_TASKS_PER_NODE={tasks_per_node!r} is not in srun's format")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if not 0 <= node < len(counts):
        raise LaunchError(f"SLURM_NODEID={node} has no entry in SLURM_TASKS_PER_NODE={tasks_per_node!r}")
    return counts[node]


def _slurm_local_world(environ: Mapping[str, str]) -> int:
    if "SLURM_NTASKS_PER_NODE" in environ:
        return _integer(environ, "SLURM_NTASKS_PER_NODE")
    if "SLURM_TASKS_PER_NODE" in environ:
        return tasks_on_node(environ["SLURM_TASKS_PER_NODE"], _integer(environ, "SLURM_NODEID"))
    return 1


def placement(environ: MutableMapping[str, str]) -> Placement:
    """This rank's place, from torchrun's variables or, where RANK is unset, srun's, which are then
    exported as torchrun's so that init_method env:// reads them."""
    launcher = "torchrun"
    if "RANK" not in environ:
        if "SLURM_PROCID" not in environ:
            raise LaunchError(
                "RANK is unset: start one process per rank with torchrun (or any launcher that sets RANK, "
                "WORLD_SIZE, MASTER_ADDR and MASTER_PORT) or with srun"
            )
        launcher = "srun"
        environ["RANK"] = environ["SLURM_PROCID"]
        environ["WORLD_SIZE"] = environ.get("SLURM_NTASKS", "1")
        environ["LOCAL_RANK"] = environ.get("SLURM_LOCALID", "0")
        environ["LOCAL_WORLD_SIZE"] = str(_slurm_local_world(environ))
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE") if not environ.get(name)]
    if missing:
        hint = MASTER_HINT if launcher == "srun" else "set them as torchrun does"
        raise LaunchError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} unset: {hint}")
    # One process per pod or host (a Kubernetes PyTorchJob without torchrun) sets no LOCAL_*.
    return Placement(
        rank=_integer(environ, "RANK"),
        world_size=_integer(environ, "WORLD_SIZE"),
        local_rank=_integer(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else 0,
        local_world_size=_integer(environ, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else 1,
        launcher=launcher,
    )


def rank_device(device_type: str, where: Placement, share_gpu: bool, environ: MutableMapping[str, str]) -> torch.device:
    """This rank's device, made current; call before any NCCL group exists.

    One GPU per local rank. With `share_gpu` every rank takes GPU 0, and each
    process becomes its own NCCL host (NCCL_HOSTID), since NCCL refuses two
    ranks of one host on one GPU (docs/design.md, "One GPU, several processes").
    """
    if device_type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise LaunchError("--device cuda: torch sees no CUDA device here (use --device cpu)")
    gpus = torch.cuda.device_count()
    if share_gpu:
        # The host id only: NCCL's network is the user's to give (docs/validating.md).
        default_shared_gpu_env(environ, where.rank, "fairring-validate-rank", loopback=False)
        index = 0
    elif gpus < where.local_world_size:
        raise LaunchError(
            f"this host has {gpus} GPU(s) for {where.local_world_size} local ranks: start at most one rank per "
            "GPU (torchrun --nproc-per-node, srun --ntasks-per-node), or pass --share-gpu on a one-GPU test machine"
        )
    else:
        index = where.local_rank
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def die_with_parent() -> None:
    """A rank whose launcher died would wait in a collective until its timeout: have the kernel end
    it with its parent (torchrun's agent, srun's step daemon) instead."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
