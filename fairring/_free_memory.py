"""What a rank may still allocate: on its GPU, or on its host."""

from __future__ import annotations

import torch

from ._config import ENGINE_OFF_THRESHOLD
from ._sizes import KiB


def gpu_cached_bytes(device: torch.device) -> int:
    """The caching allocator's free blocks: this process's too, as it releases them and retries before it fails."""
    return torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def gpu_free_bytes(device: torch.device) -> int:
    """The GPU's free memory and the caching allocator's free blocks."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + gpu_cached_bytes(device)


def host_available_bytes(meminfo: str = "/proc/meminfo") -> int:
    """The kernel's estimate of the memory a process may take without swapping; unknown: unbounded."""
    try:
        with open(meminfo) as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * KiB
    except OSError:
        pass
    return ENGINE_OFF_THRESHOLD
