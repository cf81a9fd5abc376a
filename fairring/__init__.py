"""fairring: a Herring-style all-reduce as a PyTorch c10d backend.

import fairring
torch.distributed.init_process_group("fairring")
"""

from __future__ import annotations

import torch
import torch.distributed

from ._version import __version__
from .config import Config, ConfigError, load_config
from .topology import TopologyError


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


_C = _load_extension()


def build_info() -> dict[str, object]:
    """What the extension was built with: versions and whether the CUDA path is in."""
    return dict(_C.build_info())


from ._registration import BACKEND_NAME, register  # noqa: E402

register()

__all__ = ["BACKEND_NAME", "Config", "ConfigError", "TopologyError", "__version__", "build_info", "load_config"]
