"""Which ranks share a machine, and in what order (their rail index).

Each rank works out its own identity (`identify_self`); the group's
rendezvous (fairring/_rendezvous.py) gives each rank its view of the layout,
which is what `group_into_machines` (a pure function, the reference its tests
compare against) gives for the same identities.

A machine is where the same-host transports (shared memory, CUDA IPC) work. The
identity comes from, in order of precedence:

1. FAIRRING_MACHINE_ID: explicit, for containers, tests and odd launchers;
2. torchrun's GROUP_RANK: one torchrun agent per machine;
3. the host itself: kernel boot id, hostname, and the network, IPC and PID
   namespaces. The boot id alone (the original design) merges containers that
   share a kernel but cannot share memory; the namespaces tell them apart.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from ._config import MACHINE_ID, Config, ConfigError

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_NAMESPACES = ("net", "ipc", "pid")

logger = logging.getLogger("fairring")


class TopologyError(dist.DistStoreError):
    """The ranks of a group could not learn each other's machines through the store (e.g. a rank never joined).

    A DistStoreError, as NCCL's and Gloo's init raise where a rank never comes to the store.
    """

    def __init__(self, message: str, missing: list[int] | None = None) -> None:
        super().__init__(message)
        # The group's ranks that never joined, where that was the cause.
        self.missing = missing or []


@dataclass(frozen=True)
class RankIdentity:
    machine_id: str
    # What set machine_id (shown in logs): all ranks should use the same.
    source: str
    # The launcher's LOCAL_RANK, which orders ranks within a machine.
    local_rank: int | None = None
    # The host itself (host_identity()), whatever set machine_id: the common
    # ground when ranks identify their machine in different ways.
    host: str = ""


def host_identity() -> str:
    """An id shared exactly by processes that can use same-host transports."""
    try:
        boot_id = _BOOT_ID.read_text().strip()
    except OSError:
        boot_id = "unknown-boot"
    namespaces = []
    for name in _NAMESPACES:
        try:
            namespaces.append(os.readlink(f"/proc/self/ns/{name}"))
        except OSError:
            namespaces.append(f"{name}:?")
    return f"{socket.gethostname()}/{boot_id}/{','.join(namespaces)}"


def _int_var(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer (it is set by the launcher, e.g. torchrun)") from None


def identify_self(config: Config, env: Mapping[str, str] | None = None) -> RankIdentity:
    env = os.environ if env is None else env
    local_rank = _int_var(env, "LOCAL_RANK")
    host = host_identity()
    if config.machine_id is not None:
        return RankIdentity(config.machine_id, MACHINE_ID, local_rank, host)
    group_rank = _int_var(env, "GROUP_RANK")
    if group_rank is not None:
        return RankIdentity(f"torchrun node {group_rank}", "torchrun's GROUP_RANK", local_rank, host)
    return RankIdentity(host, "host discovery", local_rank, host)


def group_into_machines(identities: Sequence[RankIdentity]) -> list[list[int]]:
    """Group ranks (indices into `identities`) into machines.

    Machines are ordered by their lowest rank; ranks within a machine by
    LOCAL_RANK when the launcher gave one, else by rank. Any layout is
    accepted: machines may hold different numbers of ranks (the engine then
    leaves the group to the flat path). Ranks that identify their machine in
    different ways are grouped by host instead, with a warning.
    """
    if not identities:
        raise TopologyError("fairring: a group needs at least one rank")
    sources = {identity.source for identity in identities}
    machine_of = [identity.machine_id for identity in identities]
    if len(sources) > 1:
        warn_mixed_sources({s: [r for r, i in enumerate(identities) if i.source == s] for s in sources})
        machine_of = [identity.host for identity in identities]
    machines: dict[str, list[int]] = {}
    for rank, machine_id in enumerate(machine_of):
        machines.setdefault(machine_id, []).append(rank)

    def local_order(rank: int) -> tuple[int, int]:
        local_rank = identities[rank].local_rank
        return (rank if local_rank is None else local_rank, rank)

    layout = []
    for machine_id, ranks in machines.items():
        ranks.sort(key=local_order)
        local_ranks = [identities[r].local_rank for r in ranks]
        if None not in local_ranks and len(set(local_ranks)) != len(local_ranks):
            # The order stays deterministic (rank breaks ties); only the rails' pairing may be odd.
            logger.debug("machine %r: ranks %s report repeated LOCAL_RANK %s", machine_id, ranks, local_ranks)
        layout.append(ranks)
    if len({len(ranks) for ranks in layout}) > 1:
        logger.debug(
            "irregular layout (%s): all-reduces take the flat path",
            "; ".join(f"{machine_id!r}: ranks {ranks}" for machine_id, ranks in machines.items()),
        )
    return layout


def warn_mixed_sources(ranks_by_source: Mapping[str, list[int]]) -> None:
    """The warning for ranks that identify their machine in different ways (then grouped by host)."""
    logger.warning(
        "fairring: ranks identify their machine in different ways (%s); grouping them by host instead. "
        "Set %s on every rank or on none, and launch all ranks the same way.",
        "; ".join(f"ranks {ranks_by_source[source]} by {source}" for source in sorted(ranks_by_source)),
        MACHINE_ID,
    )


def check_settings_agree(settings_by_rank: Sequence[Mapping[str, int]]) -> None:
    for name in settings_by_rank[0]:
        values = {rank: settings[name] for rank, settings in enumerate(settings_by_rank)}
        if len(set(values.values())) > 1:
            raise ConfigError(
                f"fairring: {name} differs across ranks ({values}); every rank of a group must use the same value"
            )
