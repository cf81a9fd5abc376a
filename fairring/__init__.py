"""fairring: a Herring-style all-reduce as a PyTorch c10d backend.

import fairring
torch.distributed.init_process_group("fairring")
"""

from __future__ import annotations

import atexit
import os

# Imported first: it notes (_infiniband.IMPORT_STATE) whether the user set the
# variables below and whether libibverbs is already in the process, which
# decides whether the rails may use InfiniBand (fairring._transports).
from . import _infiniband  # noqa: F401

# fork() after ibverbs is loaded corrupts memory unless this is set first
# (DataLoader workers fork); TensorPipe's InfiniBand transport loads ibverbs.
# libibverbs reads them when it initialises (at its first device listing).
os.environ.setdefault("RDMAV_FORK_SAFE", "1")
os.environ.setdefault("IBV_FORK_SAFE", "1")

import torch
import torch.distributed  # registers the c10d types that _C builds on

from ._config import DUMP_SIGNAL, parse_dump_signal
from ._errors import ConfigError
from ._log import install_handler
from ._topology import TopologyError
from ._version import __version__
from .types import BuildInfo, ExtensionBuildInfo


def _load_extension():  # type: ignore[no-untyped-def]
    try:
        from . import _C
    except ImportError as error:
        raise ImportError(
            f"fairring's C++ extension could not be loaded ({error}). It must be built "
            f"against the torch it runs with (this is torch {torch.__version__}): reinstall "
            "fairring with `pip install --no-build-isolation .` in this environment."
        ) from error
    built = _C.build_info()["torch"]
    running = torch.__version__.split("+")[0]
    if built != running:
        raise ImportError(
            f"fairring was built against torch {built} but torch {running} is running; "
            "rebuild fairring in this environment"
        )
    return _C


# A build without the CUDA path says so where a group asks for the CUDA engine (_registration.check_cuda_path),
# not here: the engine is off by default, and every rank of every job would see it.
_C = _load_extension()
install_handler()


def pending() -> list[str]:
    """What each engine op of this process's fairring groups is waiting on, one line each.

    The op's number, size, dtype and op, its age, the stage and slice it is
    in and the ranks it awaits, as its timeout would name them; empty where
    nothing is pending. Safe from any thread, e.g. a watchdog of the job's
    own; FAIRRING_DUMP_SIGNAL=USR2 prints the same on `kill -USR2 <pid>`.
    """
    return list(_C.pending_report())


def build_info() -> BuildInfo:
    """fairring's version, and what the extension was built with: versions and whether the CUDA path is in.

    "nccl" is the NCCL that torch ships: fairring's NCCL groups are torch's own.
    """
    built: ExtensionBuildInfo = _C.build_info()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if built["cuda_path"] else None
    return {"fairring": __version__, **built, "nccl": nccl}


# A failure's error reaches its waiter at once, while torch's abort hooks (the
# flight recorder's dump) still run on a thread of their own: a process that
# exits on that error waits for them here, so the dump is written.
FAILURE_REPORT_WAIT_S = 60.0


def _await_failure_reports() -> None:
    if not _C.await_failure_reports(FAILURE_REPORT_WAIT_S):
        import logging

        logging.getLogger("fairring").warning(
            "exiting while the flight recorder's dump of a failure still runs after %.0f s; it may be incomplete",
            FAILURE_REPORT_WAIT_S,
        )


atexit.register(_await_failure_reports)

# Process-wide, so read once here: a bad value fails the import that would install it.
_dump_signal = parse_dump_signal(os.environ.get(DUMP_SIGNAL))
if _dump_signal is not None:
    _C.report_pending_on_signal(_dump_signal)

from ._ddp import name_fairring_in_ddp_logging  # noqa: E402
from ._introspection import backend_of  # noqa: E402
from ._options import Options  # noqa: E402
from ._registration import BACKEND_NAME, register  # noqa: E402
from ._shrink import register_shrunk_groups_as_fairring  # noqa: E402
from ._summary import PathUsage, Summary, summary  # noqa: E402

register()
name_fairring_in_ddp_logging(BACKEND_NAME)
register_shrunk_groups_as_fairring()

# What the docs document; the rest is internal (the _-prefixed modules).
__all__ = [
    "ConfigError",
    "Options",
    "PathUsage",
    "Summary",
    "TopologyError",
    "__version__",
    "backend_of",
    "build_info",
    "pending",
    "summary",
]

# Named as users reach them (fairring.ConfigError in a traceback), not by the private module they live in.
for _public in (ConfigError, Options, PathUsage, Summary, TopologyError):
    _public.__module__ = __name__
del _public
