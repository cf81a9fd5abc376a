"""The NIXL rails' library and UCX settings, found and chosen at init rather than at the first all-reduce.

NIXL is an optional dependency (`pip install 'fairring[nixl]'`, the nixl-cu13 wheel). Its C API,
libnixl_capi.so, sits beside the wheel's package, and the C++ mesh loads it by path
(csrc/rails/nixl/library.h), so nothing here imports NIXL.

UCX reads its settings from the environment when the first agent is made; where the user set
none, the rails get what TensorPipe's get: network transports only (rail peers are on other
machines by definition) on the interface fairring chose, unless InfiniBand may carry them.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import MutableMapping
from pathlib import Path

from .config import RAILS_TRANSPORT, ConfigError

logger = logging.getLogger("fairring")

# The modules of the nixl-cu13 and nixl-cu12 wheels, preferred in this order.
NIXL_MODULES = ("nixl_cu13", "nixl_cu12")
C_API = "libnixl_capi.so"
# Same-host transports: never between rail peers.
UCX_SAME_HOST_EXCLUDED = "^sm,cma,cuda_ipc"
INFINIBAND_CLASS = Path("/sys/class/infiniband")


def nixl_library() -> str:
    """The path of NIXL's C API library; ConfigError, saying what to install, if there is none."""
    for module in NIXL_MODULES:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            continue
        site = Path(spec.origin).resolve().parent.parent
        library = site / f".{module}.mesonpy.libs" / C_API
        if library.is_file():
            return str(library)
    raise ConfigError(
        f"{RAILS_TRANSPORT}=nixl, but NIXL is not installed in this Python ({', '.join(NIXL_MODULES)} "
        f"with {C_API}): install it with pip install 'fairring[nixl]', or use {RAILS_TRANSPORT}=tensorpipe"
    )


def choose_ucx_settings(interface: str, ib_disable: bool, env: MutableMapping[str, str] | None = None) -> str:
    """Sets UCX_TLS and UCX_NET_DEVICES in `env` (default os.environ) where unset; what UCX will use, as text."""
    env = os.environ if env is None else env
    chosen: list[str] = []
    if not env.get("UCX_TLS"):
        env["UCX_TLS"] = UCX_SAME_HOST_EXCLUDED
        chosen.append(f"UCX_TLS={UCX_SAME_HOST_EXCLUDED} (fairring's: network transports only)")
    else:
        chosen.append(f"UCX_TLS={env['UCX_TLS']} (yours)")
    infiniband = INFINIBAND_CLASS.is_dir() and any(INFINIBAND_CLASS.iterdir())
    if env.get("UCX_NET_DEVICES"):
        chosen.append(f"UCX_NET_DEVICES={env['UCX_NET_DEVICES']} (yours)")
    elif ib_disable or not infiniband:
        env["UCX_NET_DEVICES"] = interface
        chosen.append(f"UCX_NET_DEVICES={interface} (fairring's: the rails' interface)")
    else:
        chosen.append("UCX_NET_DEVICES unset (UCX chooses among InfiniBand devices and interfaces)")
    return ", ".join(chosen)
