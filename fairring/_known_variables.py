"""Every FAIRRING_* variable fairring knows, so that a misspelled one is named rather than ignored.

A job that sets FAIRRING_SLIC_SIZE=4M gets one WARNING naming FAIRRING_SLICE_SIZE,
the closest known name, instead of silently running with the default slices.
The test suite's switches live under TEST_SWITCH_PREFIX, are read in one place
(csrc/test_switches.cpp) and are never checked here: they are not settings.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping

from . import _config as config
from . import _interfaces as interfaces

logger = logging.getLogger("fairring")

PREFIX = "FAIRRING_"
TEST_SWITCH_PREFIX = "FAIRRING_TEST_"

# What a job sets (docs/configuration.md).
SETTINGS = frozenset(
    {
        config.TOTAL_MEMORY,
        config.SLICE_SIZE,
        config.SLICES_IN_FLIGHT,
        config.FLAT_THRESHOLD,
        config.CPU_FLAT_THRESHOLD,
        config.CUDA_FLAT_THRESHOLD,
        config.MIN_SHARD_SIZE,
        config.MACHINE_ID,
        config.LOG_LEVEL,
        config.CUDA_ENGINE,
        config.IB_DISABLE,
        config.SHM_DISABLE,
        config.RAIL_FAILOVER,
        config.TIMELINE,
        config.RAILS_TRANSPORT,
        config.NIXL_BACKEND,
        config.DUMP_SIGNAL,
        config.AUTO_BUDGET,
        config.AUTO_CACHE,
        config.SERIALIZED_LAUNCHES,
        config.ENGINE_DISABLE,
        config.CUDA_WAIT,
        config.RAILS_SECRET,
        config.RAILS_ENCRYPT,
        config.TRANSPORTS,
        config.CHANNELS,
        config.IB_HCA,
        config.IB_GID_INDEX,
        interfaces.SOCKET_IFNAME,
        interfaces.SOCKET_FAMILY,
        interfaces.RAIL_INTERFACES,
    }
)
# What setup.py and the make targets read: harmless in a job's environment, so not unknown.
BUILD_AND_TOOLS = frozenset(
    {
        "FAIRRING_WITH_CUDA",
        "FAIRRING_WITH_TENSORPIPE",
        "FAIRRING_WITH_EXTENSION",
        "FAIRRING_UNITY",
        "FAIRRING_PCH",
        "FAIRRING_SANITIZE",
        "FAIRRING_GPU_REPORT",
    }
)
KNOWN = SETTINGS | BUILD_AND_TOOLS

_warned: set[str] = set()


def unknown_variable_notes(names: Iterable[str]) -> list[str]:
    """One note per FAIRRING_* name fairring does not know, naming the closest known one."""
    notes = []
    for name in sorted(names):
        if not name.startswith(PREFIX) or name in KNOWN or name.startswith(TEST_SWITCH_PREFIX):
            continue
        # Compared without the prefix, which every candidate shares and would make anything look close.
        suffixes = sorted(known.removeprefix(PREFIX) for known in KNOWN)
        closest = difflib.get_close_matches(name.removeprefix(PREFIX), suffixes, n=1, cutoff=0.6)
        hint = f"did you mean {PREFIX}{closest[0]}?" if closest else "docs/configuration.md lists every variable"
        notes.append(f"{name} is set, but fairring has no such variable and ignores it; {hint}")
    return notes


def warn_unknown_variables(env: Mapping[str, str]) -> None:
    """Logs each unknown FAIRRING_* variable of `env` once per process."""
    for note in unknown_variable_notes(name for name in env if name not in _warned):
        logger.warning(note)
    _warned.update(name for name in env if name.startswith(PREFIX))
