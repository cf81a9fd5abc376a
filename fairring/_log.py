"""fairring's log: one level for Python and C++ (FAIRRING_LOG_LEVEL), one handler, lines that name the rank.

Each line reads as NCCL's do, with the time first:

    2026-12-01 21:30:24.537 host1:4120 [rank 3] fairring INFO: rank 3 (machine 1 of 2, rail 1): rails on eth1 ...

The "fairring" logger gets its own stderr handler at import (unless the
user gave it handlers first) and does not propagate, so a job's
logging.basicConfig does not print its lines twice. FAIRRING_LOG_LEVEL sets
its level and the C++ notices' (failover, a stuck local group, a failed
hook), which then print in the same format. Unset, Python logs WARNING and
up and the C++ notices go through c10's logging, which TORCH_CPP_LOG_LEVEL
governs, as it does NCCL's and Gloo's.
"""

from __future__ import annotations

import logging
import os
import socket

import torch.distributed as dist

LOGGER_NAME = "fairring"
LINE_FORMAT = "%(asctime)s.%(msecs)03d %(hostname)s:%(process)d [rank %(rank)s] fairring %(levelname)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
# The C++ side's levels (csrc/log.h, LogLevel).
_CPP_LEVELS = {"DEBUG": 0, "INFO": 1, "WARNING": 2, "ERROR": 3}

_HOSTNAME = socket.gethostname()
# The rank named before the default group exists (while it is being made): the making group's.
_rank_hint: int | None = None


def process_rank() -> int | None:
    """This process's rank in the default group; while that is being made, the launcher's RANK or the hint."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    if _rank_hint is not None:
        return _rank_hint
    launcher = os.environ.get("RANK", "")
    return int(launcher) if launcher.isdigit() else None


class _Identity(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        rank = process_rank()
        record.hostname = _HOSTNAME
        record.rank = "?" if rank is None else str(rank)
        return True


def install_handler() -> None:
    """At import: fairring's lines go to stderr through a handler of its own and no further."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.handlers:
        return  # the user's: their format, their destination
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LINE_FORMAT, DATE_FORMAT))
    handler.addFilter(_Identity())
    logger.addHandler(handler)
    logger.propagate = False
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


def apply_log_level(level: str | None, rank: int) -> None:
    """FAIRRING_LOG_LEVEL (None: unset), for Python and C++ alike; `rank`: the group's being made."""
    from . import _C

    global _rank_hint
    if _rank_hint is None:
        _rank_hint = rank  # the first group made is the default group, where its rank is the process's
    if level is not None:
        logging.getLogger(LOGGER_NAME).setLevel(level)
    named = process_rank()
    _C.set_log_level(None if level is None else _CPP_LEVELS[level], -1 if named is None else named)
