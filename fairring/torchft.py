"""fairring as torchft's fault-tolerant process group: ProcessGroupFairring.

    from fairring.torchft import ProcessGroupFairring
    manager = torchft.Manager(pg=ProcessGroupFairring(), ...)

torchft rebuilds its process group at every quorum through
`ProcessGroupWrapper._create_pg(store, rank, world_size)`, as its own
ProcessGroupGloo and ProcessGroupNCCL do; this one makes a fairring group
there, registered for CPU and CUDA tensors. torchft learns of a failure from
the failed op's error, and from `errored()`, which here names the cause
fairring named. Imported on its own: fairring does not need torchft.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

try:
    from torchft.process_group import ProcessGroupWrapper
except ImportError as error:
    raise ImportError(f"fairring.torchft needs torchft ({error}); install it with `pip install torchft`") from error

from . import _C
from ._options import Options
from ._registration import create_backend
from ._shrink import serve_cpu_and_cuda

BACKEND_NAME = "torchft-fairring"


class ProcessGroupFairring(ProcessGroupWrapper):
    """A reconfigurable fairring process group for torchft's Manager.

    timeout: every op's, and the rendezvous's of each rebuild.
    options: the fairring.Options every rebuilt group gets.
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60), options: Options | None = None) -> None:
        super().__init__(timeout=timeout)
        self._options = options
        self._backend: _C.Backend | None = None

    def _create_pg(self, store: dist.Store, rank: int, world_size: int) -> dist.ProcessGroup:
        # Each quorum's store is its own (torchft prefixes it), so rebuilds never meet an old one's keys.
        backend = create_backend(store, rank, world_size, self._timeout, BACKEND_NAME, self._options)
        group = dist.ProcessGroup(store, rank, world_size)
        serve_cpu_and_cuda(group, backend)
        self._backend = backend
        return group

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def errored(self) -> Exception | None:
        """The group's failure, as fairring named it; None while it works (or before the first quorum)."""
        backend = self._backend
        if backend is None or self._pg is None:
            return None
        failure = backend.failure
        if failure:
            return RuntimeError(f"fairring: the process group failed: {failure}")
        # A group without an engine: its Gloo collectives' own failures (torch >= 2.15 says).
        get_error = getattr(backend, "get_error", None)
        if get_error is not None and get_error() != torch._C._distributed_c10d.ErrorType.SUCCESS:
            return RuntimeError(f"fairring: the process group failed ({get_error().name}); see its ops' errors")
        return None

    def abort(self, errored: bool = True) -> None:
        super().abort(errored=errored)
        self._backend = None
