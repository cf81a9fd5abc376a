"""Paths timed in turns on the same data: fill, barrier, time to the device's end, check.

fairring.validate's sweep and the GPU check's side-by-side phase (benchmarks/cuda_bench.py)
time their paths so. Each iteration runs every path once, in the other order every other
iteration, so that neither always runs first (on caches warmed, or a device left busy, by the
other); each run starts from a barrier of every rank with nothing queued on the device, and
ends when its result is on the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


def time_in_turns(
    names: Sequence[str],
    *,
    warmup: int,
    iters: int,
    fill: Callable[[str], object],
    run: Callable[[str], object],
    check: Callable[[str], object],
    sync: Callable[[], object],
    barrier: Callable[[], object],
) -> dict[str, list[float]]:
    """Each path's seconds per timed iteration (after `warmup` untimed ones), by its name.

    A path's turn: fill(name) its input, sync() the device, barrier(), then run(name) (issue
    and wait) and sync() timed; check(name) after the timing records what the result is."""
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for iteration in range(warmup + iters):
        order = names if iteration % 2 == 0 else names[::-1]
        for name in order:
            fill(name)
            sync()
            barrier()
            start = time.perf_counter()
            run(name)
            sync()
            elapsed = time.perf_counter() - start
            check(name)
            if iteration >= warmup:
                seconds[name].append(elapsed)
    return seconds
