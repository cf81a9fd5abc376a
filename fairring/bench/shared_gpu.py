"""Several processes on one GPU, each an NCCL host of its own: the environment that lets NCCL take them.

NCCL refuses two ranks of one communicator on one GPU of one host ("Duplicate GPU
detected"): it compares the host hash, which NCCL_HOSTID sets, and the bus id. A
distinct NCCL_HOSTID per process makes each its own host, and NCCL then connects
them through its socket transport (docs/design.md, "One GPU, several processes").
The GPU check, tests/test_cuda.py, the bench's ranks and `fairring.validate
--share-gpu` all run so; the prefix of the host id says which of them a process is.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from types import MappingProxyType

# NCCL's socket transport on loopback, with InfiniBand, NVLink SHARP and multi-node NVLink off: the
# processes are hosts to NCCL only, so nothing but loopback connects them. Where a caller's network
# is another (the bench's emulated hosts, a cluster under validate), it sets these itself.
NCCL_ON_LOOPBACK: Mapping[str, str] = MappingProxyType(
    {
        "NCCL_SOCKET_IFNAME": "lo",
        "NCCL_IB_DISABLE": "1",
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_MNNVL_ENABLE": "0",
    }
)


def shared_gpu_env(rank: int | str, prefix: str, *, loopback: bool) -> dict[str, str]:
    """Rank `rank`'s NCCL_HOSTID, `<prefix>-<rank>`, then, with `loopback`, NCCL_ON_LOOPBACK's settings.

    `rank` as its launcher gave it (RANK's text, say): it only names the host."""
    return {"NCCL_HOSTID": f"{prefix}-{rank}", **(NCCL_ON_LOOPBACK if loopback else {})}


def default_shared_gpu_env(environ: MutableMapping[str, str], rank: int | str, prefix: str, *, loopback: bool) -> None:
    """shared_gpu_env's settings put in `environ` where it has none: what the user set wins."""
    for name, value in shared_gpu_env(rank, prefix, loopback=loopback).items():
        environ.setdefault(name, value)
