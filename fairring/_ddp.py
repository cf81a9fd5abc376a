"""DDP's logging data names fairring as its backend.

torch's ProcessGroup takes its name from an enum of the backends torch ships,
so DDP records every other backend as "custom"; tools that read
`_get_ddp_logging_data()` would mislabel fairring jobs. This corrects the name
where DDP hands it out, for groups created as "fairring", and leaves every
other field and group alone.
"""

from __future__ import annotations

import functools
from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

_INSTALLED = "_fairring_names_backend"


def name_fairring_in_ddp_logging(backend_name: str) -> None:
    original = DistributedDataParallel._get_ddp_logging_data
    if getattr(original, _INSTALLED, False):
        return

    @functools.wraps(original)
    def _get_ddp_logging_data(self: DistributedDataParallel) -> dict[str, Any]:
        data = original(self)
        if data.get("backend_name") == "custom" and _created_as(self.process_group) == backend_name:
            data["backend_name"] = backend_name
        return data

    setattr(_get_ddp_logging_data, _INSTALLED, True)
    DistributedDataParallel._get_ddp_logging_data = _get_ddp_logging_data  # type: ignore[method-assign]


def _created_as(group: Any) -> str | None:
    try:
        return str(dist.get_backend(group))
    except (RuntimeError, ValueError):  # not a registered group
        return None
