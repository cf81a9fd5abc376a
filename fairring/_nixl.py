"""The NIXL rails' library and UCX settings, found and chosen at init rather than at the first all-reduce.

NIXL is an optional dependency (`pip install 'nixl-cu13>=1.4'`, the nixl-cu13 wheel). Its C API,
libnixl_capi.so, sits beside the wheel's package, and the C++ mesh loads it by path
(csrc/rails/nixl/library.h), so nothing here imports NIXL.

UCX reads its settings from the environment when the first agent is made; where the user set
none, the rails get network transports only (rail peers are on other machines by definition), on
one InfiniBand or RoCE port per rail (FAIRRING_IB_HCA, FAIRRING_IB_GID_INDEX), else on the
interface fairring chose. NIXL's libfabric plugin maps each GPU to its nearest EFA devices itself.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import MutableMapping
from pathlib import Path

from ._config import IB_DISABLE, IB_GID_INDEX, RAILS_TRANSPORT, ConfigError, TransportSettings
from ._infiniband import HostFacts
from ._transports import map_gpus_to_nics

logger = logging.getLogger("fairring")

# The modules of the nixl-cu13 and nixl-cu12 wheels, preferred in this order.
NIXL_MODULES = ("nixl_cu13", "nixl_cu12")
C_API = "libnixl_capi.so"
# Same-host transports: never between rail peers.
UCX_SAME_HOST_EXCLUDED = "^sm,cma,cuda_ipc"
# UCX's TCP segments (8 KiB by default) bound each copy out of GPU memory: one
# MiB each measured 15x faster for GPU staging (docs/benchmarks.md), and TCP's
# zero-copy path for host memory does not use them.
UCX_TCP_SEGMENTS = ("UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE")
UCX_TCP_SEGMENT = "1m"
LOOPBACK = "lo"
# What choose_ucx_settings set in this process's environment.
_ours: dict[str, str] = {}


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
        f"with {C_API}): install it with pip install 'nixl-cu13>=1.4', or use {RAILS_TRANSPORT}=tensorpipe"
    )


def rail_ib_device(settings: TransportSettings, facts: HostFacts, rail: int, gpu: int | None) -> tuple[str | None, str]:
    """The InfiniBand or RoCE port (`mlx5_0:1`) this rail's UCX uses, or None; and why.

    One device per rail, as NCCL gives each GPU its nearest NIC: the device nearest this rank's GPU by PCI
    path where `gpu` is known, else the rail's turn among the devices, each on its first usable port.
    """
    if settings.ib_disable:
        return None, f"{IB_DISABLE}=1"
    hca = settings.ib_hca
    ports = {}
    for device in facts.devices:
        usable = [p for p in device.ports if p.active and (hca is None or hca.selects(device.name, p.number))]
        if usable:
            ports[device.name] = usable[0].number
    if not ports:
        if hca is not None:
            raise ConfigError(
                f"{hca.setting()} selects no active InfiniBand or RoCE port of this machine; its devices: "
                f"{facts.describe_devices()}"
            )
        return None, "no active InfiniBand or RoCE port" if facts.devices else "no InfiniBand device"
    devices = [device for device in facts.devices if device.name in ports]
    if gpu is not None and gpu < len(facts.gpus):
        nics, rule = map_gpus_to_nics(facts.gpus, devices)
        name, why = nics[gpu], f"GPU {gpu}'s device, {rule}"
    else:
        name, why = devices[rail % len(devices)].name, f"rail {rail}'s turn among {len(devices)} device(s)"
    return f"{name}:{ports[name]}", why + (f", as {hca.setting()} selects" if hca is not None else "")


def choose_ucx_settings(
    interface: str,
    settings: TransportSettings,
    facts: HostFacts,
    rail: int,
    gpu: int | None,
    env: MutableMapping[str, str] | None = None,
) -> str:
    """Sets UCX's variables in `env` (default os.environ) where the user left them unset; what UCX will use, as text.

    Without InfiniBand UCX gets this rail's `interface` and loopback: UCX spreads a transfer over every
    device that reaches the peer (benchmarks/nixl_lanes.py), so any other NIC listed would carry part of
    this rail's traffic, and a rail would stall when that NIC went down. Loopback, which UCX uses only
    within a host, carries the control connections to the machine's other ranks, whose rails may be on
    networks this one does not reach (docs/networking.md).
    """
    env = os.environ if env is None else env
    chosen: list[str] = []

    def choose(variable: str, value: str, why: str) -> None:
        # A value fairring set for an earlier group of this process is still fairring's.
        ours = env is os.environ and _ours.get(variable) == env.get(variable)
        if env.get(variable) and not ours:
            chosen.append(f"{variable}={env[variable]} (yours)")
        else:
            env[variable] = value
            if env is os.environ:
                _ours[variable] = value
            chosen.append(f"{variable}={value} (fairring's: {why})")

    choose("UCX_TLS", UCX_SAME_HOST_EXCLUDED, "network transports only")
    device, why = rail_ib_device(settings, facts, rail, gpu)
    if device is None:
        devices = list(dict.fromkeys([interface, LOOPBACK]))
        own = "this rail's interface, loopback within the host"
        choose("UCX_NET_DEVICES", ",".join(devices), f"{own}; no InfiniBand: {why}")
    else:
        choose("UCX_NET_DEVICES", device, why)
        if settings.gid_index is not None:
            choose("UCX_IB_GID_INDEX", str(settings.gid_index), IB_GID_INDEX)
    for variable in UCX_TCP_SEGMENTS:
        choose(variable, UCX_TCP_SEGMENT, "UCX's 8 KiB segments made GPU memory over TCP 15x slower")
    return ", ".join(chosen)
