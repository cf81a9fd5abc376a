"""What the harness's fork server loads once, so that each rank forked from it starts warm.

Importing torch takes seconds of CPU, the first torch.testing.assert_close
another 0.6 s (it imports sympy and mpmath on first use), and the first
DistributedDataParallel 0.9 s (it imports torch._dynamo), in every rank of every
pool. Done here once, a fork of it costs milliseconds. The warm-up touches only
tiny tensors, so no intra-op thread pool is started before the fork.
"""

from __future__ import annotations

import os


def _preload() -> dict[str, str]:
    """Imports and warms what the ranks use; the variables those imports set (inductor sets its cache's)."""
    before = dict(os.environ)
    import torch
    import torch._dynamo
    import torch.distributed
    import torch.testing

    tiny = torch.zeros(4)
    torch.testing.assert_close(tiny, tiny)
    return {name: value for name, value in os.environ.items() if before.get(name) != value}


# A forked rank inherits these from the fork server, as a spawned one sets them itself on importing the same.
SET_BY_PRELOAD = _preload()
