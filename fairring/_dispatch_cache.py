"""Where FAIRRING_FLAT_THRESHOLD=auto keeps its decisions, so the next job on a cluster skips the sweep.

One JSON file per key, in FAIRRING_AUTO_CACHE (default: the user's cache folder,
fairring/). The key is everything the measurement depends on that a job can
see: the collective, the layout, the rails transport and interface, rank 0's
address and its NIC's reported speed, the device and delegate and their
versions, the engine's settings, and this fairring build. A decision read
back is still checked before it is trusted (fairring/_auto_threshold.py). A
file is written whole and renamed into place, so a reader never sees half of
one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict
from typing import Any

import torch

from . import _C
from ._config import Config
from ._dispatch import Decision, SizeTiming
from ._interfaces import nic_speed_mbps
from ._version import __version__

logger = logging.getLogger("fairring")

# The entries' format and the sweep that made them: a decision of an older sweep is measured again, not
# checked and kept (2: the sweep climbs above 16 MiB, where a decision of 1 never looked).
FORMAT = 2


def cache_key(
    config: Config,
    topology: _C.Topology,
    network: _C.RailsNetwork,
    device: torch.device,
    collective: str = "all_reduce",
) -> dict[str, Any]:
    """What a cached decision must match, by name."""
    key: dict[str, Any] = {
        "format": FORMAT,
        "collective": collective,
        "fairring": __version__,
        "build": _build_identity(),
        "torch": torch.__version__,
        "device": device.type,
        "machines": topology.num_machines,
        "ranks_per_machine": topology.local_size,
        "rails_transport": network.transport,
        "nixl_backend": network.nixl_backend if network.transport == "nixl" else None,
        "interface": network.interface_name,
        # What identifies the network itself, as rank 0 sees it: a cache read on another network
        # (a home folder shared between clusters) misses. A change these miss (a shaper, a switch)
        # is left to the check of a cached decision at its first use (Sweep.verify).
        "address": network.listen_address,
        "nic_speed_mbps": nic_speed_mbps(network.interface_name),
        "transports": list(network.transports),
        "channels": list(network.cuda_channels if device.type == "cuda" else network.cpu_channels),
        "total_memory": config.total_memory,
        "slice_size": config.slice_size,
        "slices_in_flight": config.slices_in_flight,
        "min_shard": config.min_shard,
    }
    if device.type == "cuda":
        key["gpu"] = torch.cuda.get_device_name(device)
        key["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return key


def cache_path(folder: str, key: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return os.path.join(folder, f"auto-threshold-{digest}.json")


def load(folder: str, key: dict[str, Any]) -> Decision | None:
    """The decision cached under `key`, or None (a missing, unreadable or foreign file is a miss)."""
    path = cache_path(folder, key)
    try:
        with open(path) as file:
            entry = json.load(file)
        if entry["key"] != key:
            return None
        sizes = [SizeTiming(**size) for size in entry["sizes"]]
        reason = f"{entry['reason']}; from the cache {path}, measured {entry['measured_at']}"
        return Decision(int(entry["threshold"]), reason, "cache", sizes, ceiling=int(entry["ceiling"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        logger.warning("ignoring the unreadable cached threshold %s (%s); measuring again", path, error)
        return None


def store(folder: str, key: dict[str, Any], decision: Decision) -> None:
    """Writes `decision` under `key`; a cache that cannot be written is logged, not raised."""
    entry = {
        "key": key,
        "threshold": decision.threshold,
        "ceiling": decision.ceiling,
        "reason": decision.reason,
        "sizes": [asdict(size) for size in decision.sizes],
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    path = cache_path(folder, key)
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, prefix=".auto-threshold-", delete=False) as file:
            json.dump(entry, file, indent=1)
        os.replace(file.name, path)
    except OSError as error:
        logger.warning("could not cache the measured threshold in %s (%s)", folder, error)


def _build_identity() -> str:
    """This build of the extension: a rebuild measures again."""
    stat = os.stat(_C.__file__)
    return f"{stat.st_size}-{stat.st_mtime_ns}"
