"""How the ranks of one machine run the engine's local steps on CPU tensors: shared memory.

Every local rank creates its segment, publishes the name in the group's store,
maps every peer's, and reports whether it could. Only if all could do they use
shared memory; otherwise every one of them falls back to Gloo groups over
loopback, so the machine's ranks always agree. Each rank then removes its
segment's name: the mappings keep the memory, and a process that dies leaves
nothing in /dev/shm.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import torch.distributed as dist

from . import _C
from ._config import SHM_DISABLE

logger = logging.getLogger("fairring")


def shared_memory_steps(
    store: dist.Store, topology: _C.Topology, disabled: bool, timeout: timedelta
) -> _C.SharedMemorySteps | None:
    """This rank's shared-memory steps, if every rank of its machine could map every other's; else None."""
    local_rank = topology.local_rank
    local_ranks = list(topology.local_ranks)
    prefix = f"fairring/machine{topology.machine}/shm/"
    steps: _C.SharedMemorySteps | None = None
    problem = ""
    if disabled:
        problem = f"{SHM_DISABLE} is set on rank {topology.rank}"
    else:
        try:
            steps = _C.SharedMemorySteps(local_rank, local_ranks)
        except RuntimeError as error:
            problem = f"rank {topology.rank}: {error}"
    store.set(f"{prefix}name/{local_rank}", steps.segment_name if steps else "")
    names = _gather(store, f"{prefix}name/", len(local_ranks), timeout)
    if steps is not None and all(names):
        try:
            steps.attach(names)
        except RuntimeError as error:
            problem = f"rank {topology.rank}: {error}"
    store.set(f"{prefix}problem/{local_rank}", problem)
    problems = [p for p in _gather(store, f"{prefix}problem/", len(local_ranks), timeout) if p]
    if steps is not None:
        steps.unlink()  # every rank that could has mapped it
    if problems:
        if local_rank == 0:
            logger.warning(
                "machine %d: local steps use Gloo over loopback, not shared memory: %s",
                topology.machine,
                "; ".join(problems),
            )
        return None
    logger.debug("machine %d: local steps use shared memory", topology.machine)
    return steps


def _gather(store: dist.Store, prefix: str, count: int, timeout: timedelta) -> list[str]:
    keys = [f"{prefix}{index}" for index in range(count)]
    # Polled, not store.wait: a TCPStore client is one connection that a blocking wait holds, and
    # another group's setup on another thread of this process may need it to set what a peer awaits.
    deadline = time.monotonic() + timeout.total_seconds()
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = ", ".join(key for key in keys if not store.check([key]))
            raise dist.DistStoreError(f"fairring: the machine's ranks did not all publish {missing} within {timeout}")
        time.sleep(0.005)
    return [value.decode() for value in store.multi_get(keys)]
