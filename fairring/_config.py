"""Every environment variable fairring reads, parsed and validated in one place.

A bad value raises ConfigError at init, naming the variable, the value and
what is accepted, rather than failing later inside a collective.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ._errors import ConfigError
from ._interfaces import (
    GLOO_SOCKET_IFNAME,
    NCCL_SOCKET_IFNAME,
    RAIL_INTERFACES,
    SOCKET_FAMILY,
    SOCKET_IFNAME,
    TP_SOCKET_IFNAME,
    InterfaceFilter,
    parse_family,
    parse_interface_filter,
    parse_rail_interfaces,
)
from ._nccl_lists import names_match, split_list
from ._rails_secret import RAILS_ENCRYPT, RAILS_SECRET, check_rails_encrypt, parse_rails_secret
from ._sizes import KiB, MiB, format_bytes, format_size, parse_size

TOTAL_MEMORY = "FAIRRING_TOTAL_MEMORY"
SLICE_SIZE = "FAIRRING_SLICE_SIZE"
SLICES_IN_FLIGHT = "FAIRRING_SLICES_IN_FLIGHT"
FLAT_THRESHOLD = "FAIRRING_FLAT_THRESHOLD"
# One device type's threshold, over FAIRRING_FLAT_THRESHOLD for that device type.
CPU_FLAT_THRESHOLD = "FAIRRING_CPU_FLAT_THRESHOLD"
CUDA_FLAT_THRESHOLD = "FAIRRING_CUDA_FLAT_THRESHOLD"
MIN_SHARD_SIZE = "FAIRRING_MIN_SHARD_SIZE"
MACHINE_ID = "FAIRRING_MACHINE_ID"
LOG_LEVEL = "FAIRRING_LOG_LEVEL"
CUDA_ENGINE = "FAIRRING_CUDA_ENGINE"
IB_DISABLE = "FAIRRING_IB_DISABLE"
SHM_DISABLE = "FAIRRING_SHM_DISABLE"
RAIL_FAILOVER = "FAIRRING_RAIL_FAILOVER"
TIMELINE = "FAIRRING_TIMELINE"
RAILS_TRANSPORT = "FAIRRING_RAILS_TRANSPORT"
NIXL_BACKEND = "FAIRRING_NIXL_BACKEND"
DUMP_SIGNAL = "FAIRRING_DUMP_SIGNAL"
AUTO_BUDGET = "FAIRRING_AUTO_BUDGET"
AUTO_CACHE = "FAIRRING_AUTO_CACHE"
SERIALIZED_LAUNCHES = "FAIRRING_SERIALIZED_LAUNCHES"
ENGINE_DISABLE = "FAIRRING_ENGINE_DISABLE"
CUDA_WAIT = "FAIRRING_CUDA_WAIT"
# What wait() on a CUDA engine op holds until the result is back (the first is the default): only
# the caller's stream, on the GPU, as NCCL's does, with the engine launching the op's device work
# ahead of the network; or the host, the way back (docs/design.md, "The host never waits").
CUDA_WAIT_CHOICES = ("stream", "host")
# Where CUDA all-reduces go while the GPU may run every kernel in launch order (the first is the
# default): NCCL, or the engine, which the user keeps knowing that no other communicator has
# collectives in flight alongside it (docs/design.md, "Serialized launches").
SERIALIZED_LAUNCH_CHOICES = ("nccl", "engine")
# What makes a GPU run a process's kernels in launch order (docs/design.md, "Why no cross-rank
# wait cycle can form"): one hardware queue, NCCL's implicit launch order, or MPS, whose control
# daemon listens in this folder (nvidia-cuda-mps-control's default, or CUDA_MPS_PIPE_DIRECTORY).
MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
LAUNCH_ORDER_IMPLICIT = "NCCL_LAUNCH_ORDER_IMPLICIT"
MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
DEFAULT_MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"
# Signals that stop, interrupt or reap a job are its launcher's; these two are free for reports.
DUMP_SIGNALS = ("USR1", "USR2")
# Set by torchrun in every worker: how many times it has restarted the job.
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"

DEFAULT_TOTAL_MEMORY = 50 * MiB
DEFAULT_SLICE_SIZE = 4 * MiB
# Enough to keep the links busy while a slice is reduced: on 4 x 2 hosts at 1 Gbit/s, 3 or 4 in
# flight reached 96-98% of the bound, 8 (what 50 MiB held) 94% and 16 93%; at 10 Gbit/s 4 did no
# worse than 8 (docs/benchmarks.md, "Slices in flight").
DEFAULT_SLICES_IN_FLIGHT = 4
# By device type, where FAIRRING_FLAT_THRESHOLD is unset (docs/tuning.md): on CPU the Herring
# path measured 1.5-5x Gloo's speed at every size from 1 KiB to 1 MiB (loopback and 1 Gbit/s,
# 2 x 2 and 4 x 2; docs/benchmarks.md), where a threshold would apply; on CUDA 16 MiB, from the one
# GPU measurement against NCCL where the network is the bottleneck (docs/benchmarks.md, "On a GPU":
# 2 x 2, 10 Gbit/s): the engine lost all three collectives at 4 MiB, and auto measured its
# all-reduce faster than NCCL's from 16 MiB, which keeps DDP's 25 MiB buckets on it. Until the GPU
# check's versus stage measures 2 x 4 and 2 x 8.
DEFAULT_CPU_FLAT_THRESHOLD = 0
DEFAULT_CUDA_FLAT_THRESHOLD = 16 * MiB
# FAIRRING_FLAT_THRESHOLD=auto and FAIRRING_CUDA_ENGINE=auto: the threshold is measured at the
# group's first all-reduce the engine could take (fairring/_dispatch.py).
AUTO = "auto"
# A threshold to measure, as the C++ Config holds it (csrc/config.h, kMeasuredThreshold).
MEASURED_THRESHOLD = -1
# Seconds the measurement may take (FAIRRING_AUTO_BUDGET): on 2 x 2, 4 x 2 and 8 x 1 hosts at
# 1 Gbit/s it holds 16 MiB and some smaller sizes (docs/benchmarks.md, "Choosing the path by measuring").
DEFAULT_AUTO_BUDGET_S = 5.0
# Shards shorter than this cost more per byte than they carry (FAIRRING_MIN_SHARD_SIZE): on 4 x 2
# hosts, shards below 64 KiB cost at 1 Gbit/s and below 512 KiB at 10 Gbit/s, where these CPUs
# are the limit (docs/benchmarks.md, "The shard floor").
DEFAULT_MIN_SHARD_SIZE = 256 * KiB
# Smaller slices only multiply per-slice work (a 64 MiB all-reduce in 1-byte
# slices would be 64 Mi slices); 4 KiB is already far below a useful size.
MIN_SLICE_SIZE = 4 * KiB
# The flat threshold of a group kept off the engine: the largest int64, as the C++ Config holds it.
ENGINE_OFF_THRESHOLD = 2**63 - 1
# Named in messages as a setting every rank of a group must share.
GROUP_ENGINE = "fairring.Options.engine"

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
RAILS_TRANSPORTS = ("tensorpipe", "nixl")
NIXL_BACKENDS = ("UCX", "LIBFABRIC")
_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}

# The TensorPipe rails' transport variables (fairring/_transports.py decides from them).
TRANSPORTS = "FAIRRING_TRANSPORTS"
CHANNELS = "FAIRRING_CHANNELS"
IB_HCA = "FAIRRING_IB_HCA"
# Used for the rails' devices where FAIRRING_IB_HCA is unset, as an NCCL job sets it.
NCCL_IB_HCA = "NCCL_IB_HCA"
IB_GID_INDEX = "FAIRRING_IB_GID_INDEX"

# TensorPipe's fixed choices (transport/ibv/constants.h, channel/cuda_gdr/constants.h).
TENSORPIPE_PORT = 1
TENSORPIPE_GID_INDEX = 0

# Best first: the order they are registered in, by priority.
NETWORK_TRANSPORTS = ("ibv", "uv")
CPU_CHANNELS = ("basic",)
CUDA_CHANNELS = ("cuda_gdr", "cuda_basic")
_SAME_HOST = "rails peers are always on other machines, so the rails use only network"
SAME_HOST_TRANSPORTS = {"shm": "shared memory between processes of one host"}
SAME_HOST_CHANNELS = {
    "cma": "cross-memory attach between processes of one host",
    "xth": "memory copies between threads of one process",
    "cuda_ipc": "CUDA IPC between processes of one host",
    "cuda_xth": "CUDA copies between threads of one process",
}
# Network channels TensorPipe has that fairring does not register.
NOT_OFFERED_CHANNELS = {"mpt": "fairring does not register mpt (TensorPipe's multiplexing channel)"}


@dataclass(frozen=True)
class NameList:
    """A list in NCCL's grammar: the names to use, or after a leading ^ the names to leave out."""

    variable: str
    raw: str
    names: tuple[str, ...]
    exclude: bool

    def setting(self) -> str:
        return f"{self.variable}={self.raw!r}"

    def verdicts(self, candidates: Sequence[str]) -> tuple[dict[str, str | None], frozenset[str]]:
        """For each candidate: None if allowed, else why not; and the candidates required.

        An include list that names none of `candidates` leaves them automatic, so
        FAIRRING_CHANNELS=cuda_gdr says nothing about CPU buffers.
        """
        if self.exclude:
            return {n: f"excluded by {self.setting()}" if n in self.names else None for n in candidates}, frozenset()
        listed = frozenset(n for n in candidates if n in self.names)
        if not listed:
            return dict.fromkeys(candidates), frozenset()
        return {n: None if n in listed else f"{self.setting()} does not list it" for n in candidates}, listed


@dataclass(frozen=True)
class HcaSelection:
    """FAIRRING_IB_HCA in NCCL_IB_HCA's grammar: `[^][=]device[:port],...`."""

    raw: str
    entries: tuple[tuple[str, int | None], ...]
    exclude: bool = False
    exact: bool = False
    # FAIRRING_IB_HCA, or NCCL_IB_HCA where fairring's own is unset.
    variable: str = IB_HCA

    def setting(self) -> str:
        return f"{self.variable}={self.raw!r}"

    @property
    def explicit(self) -> bool:
        """Chosen for the rails: NCCL_IB_HCA chose devices for NCCL, whose RoCE GIDs the rails cannot."""
        return self.variable == IB_HCA

    def selects(self, device: str, port: int = TENSORPIPE_PORT) -> bool:
        hit = any(
            names_match(device, name, self.exact) and entry_port in (None, port) for name, entry_port in self.entries
        )
        return hit != self.exclude


@dataclass(frozen=True)
class TransportSettings:
    """The parsed variables; None: unset (automatic)."""

    transports: NameList | None = None
    channels: NameList | None = None
    ib_hca: HcaSelection | None = None
    ib_disable: bool = False
    gid_index: int | None = None


@dataclass(frozen=True)
class Config:
    """The effective configuration of one process."""

    total_memory: int = DEFAULT_TOTAL_MEMORY
    slice_size: int = DEFAULT_SLICE_SIZE
    # At most this many full slices in flight; the staging memory may hold fewer. Each rank paces
    # only its own pipeline, so ranks need not agree.
    slices_in_flight: int = DEFAULT_SLICES_IN_FLIGHT
    # All-reduces smaller than this skip the Herring path for a flat one; 0: none do; None: by
    # device type (cpu_flat_threshold, cuda_flat_threshold); AUTO: measured.
    flat_threshold: int | str | None = None
    # FAIRRING_CPU_FLAT_THRESHOLD and FAIRRING_CUDA_FLAT_THRESHOLD: one device type's, over flat_threshold.
    cpu_flat_threshold_setting: int | str | None = None
    cuda_flat_threshold_setting: int | str | None = None
    # Slices grow so that no shard is shorter, within the staging memory; 0: no floor.
    min_shard: int = DEFAULT_MIN_SHARD_SIZE
    # Overrides machine discovery: ranks with equal ids share a machine.
    machine_id: str | None = None
    log_level: str | None = None
    # Which interfaces the rails may use (fairring/_interfaces.py); None: chosen as NCCL does.
    socket_ifname: InterfaceFilter | None = None
    # The variable socket_ifname came from, for messages.
    socket_ifname_variable: str = SOCKET_IFNAME
    # "ipv4", "ipv6" or None (either, IPv4 first).
    socket_family: str | None = None
    # How rails map onto matching interfaces: "spread", "shared", or names by rail.
    rail_interfaces: str | tuple[str, ...] = "spread"
    # CUDA all-reduces take the Herring engine instead of NCCL (not yet validated on GPUs).
    cuda_engine: bool = False
    # FAIRRING_CUDA_ENGINE=auto: the engine on, its CUDA threshold measured against NCCL unless
    # FAIRRING_FLAT_THRESHOLD gives one.
    cuda_engine_auto: bool = False
    # The measurement's time limit in seconds, and the folder of its cache (None: no cache).
    auto_budget_s: float = DEFAULT_AUTO_BUDGET_S
    auto_cache: str | None = None
    # The transport variables, parsed for the rails chosen.
    transport: TransportSettings = TransportSettings()
    # CPU local steps go through Gloo over loopback instead of shared memory.
    shm_disable: bool = False
    # A rail whose interface goes down moves to the machine's other rails' interfaces (opt-in).
    rail_failover: bool = False
    # Folder where each engine writes a Chrome-trace timeline of its slices' stages.
    timeline_directory: str | None = None
    # torchrun's restart count (None outside torchrun). Its store outlives a restart, keys and
    # all, so each attempt's groups meet under their own prefix, never reading the last one's.
    launcher_attempt: int | None = None
    # What carries the rails between machines: TensorPipe, or NIXL with one of its backends.
    rails_transport: str = "tensorpipe"
    nixl_backend: str = "UCX"
    # The group's fairring.Options.engine (fairring/_options.py), applied by with_group_options.
    group_engine: bool | None = None
    # Why this process's GPU may run every kernel in launch order (None: nothing says so), and
    # where CUDA all-reduces then go (FAIRRING_SERIALIZED_LAUNCHES).
    launch_order_hazard: str | None = None
    serialized_launches: str = SERIALIZED_LAUNCH_CHOICES[0]
    # The engine's CUDA streams take the greatest priority: the group's NCCL options ask it
    # (ProcessGroupNCCL.Options.is_high_priority_stream), applied by with_group_options.
    high_priority_streams: bool = False
    # FAIRRING_ENGINE_DISABLE=1: every group off the engine, whatever its fairring.Options say (the
    # rollback switch: one variable, no code).
    engine_disable: bool = False
    # What wait() on a CUDA engine op holds (FAIRRING_CUDA_WAIT): "stream" or "host".
    cuda_wait: str = CUDA_WAIT_CHOICES[0]
    # FAIRRING_RAILS_SECRET (fairring/_rails_secret.py); never shown.
    rails_secret: str | None = field(default=None, repr=False)
    # FAIRRING_RAILS_ENCRYPT: the TensorPipe rails seal every message.
    rails_encrypt: bool = False

    @property
    def cuda_engine_routed_to_nccl(self) -> bool:
        """The CUDA engine is asked for, but its all-reduces go to NCCL: the GPU may run every kernel
        in launch order, where the engine's launches, timed by the network, could deadlock against
        another communicator's (FAIRRING_SERIALIZED_LAUNCHES=engine keeps them on the engine)."""
        return self.cuda_engine and self.launch_order_hazard is not None and self.serialized_launches == "nccl"

    @property
    def cuda_engine_in_use(self) -> bool:
        """CUDA all-reduces of groups that span machines take the engine (the C++ Config's cudaEngine)."""
        return self.cuda_engine and not self.cuda_engine_routed_to_nccl

    @property
    def ib_disable(self) -> bool:
        """The rails keep to TCP even where InfiniBand (and GPUDirect) is viable."""
        return self.transport.ib_disable

    @property
    def cpu_flat_threshold(self) -> int:
        """Bytes, or MEASURED_THRESHOLD."""
        return self._flat_threshold_of(self.cpu_flat_threshold_setting, DEFAULT_CPU_FLAT_THRESHOLD, False)

    @property
    def cuda_flat_threshold(self) -> int:
        """Bytes, or MEASURED_THRESHOLD."""
        return self._flat_threshold_of(
            self.cuda_flat_threshold_setting, DEFAULT_CUDA_FLAT_THRESHOLD, self.cuda_engine_auto
        )

    def _flat_threshold_of(self, own: int | str | None, default: int, measured_by_default: bool) -> int:
        threshold = self.flat_threshold if own is None else own
        if threshold == AUTO or (threshold is None and measured_by_default):
            return MEASURED_THRESHOLD
        return default if threshold is None else int(threshold)

    @property
    def engine_off(self) -> bool:
        """The group keeps every all-reduce off the engine (fairring.Options(engine=False))."""
        return self.group_engine is False

    def with_group_options(
        self, engine: bool | None, flat_threshold: int | None, high_priority_streams: bool = False
    ) -> Config:
        """This configuration with a group's fairring.Options applied over the variables, which
        FAIRRING_ENGINE_DISABLE=1 overrides: the group is then off the engine, as with engine=False."""
        if self.engine_disable:
            engine, flat_threshold = False, None
        # A group's threshold, like engine=False's, is the group's for both device types.
        config = self if flat_threshold is None else self._with_flat_threshold(flat_threshold)
        if high_priority_streams:
            config = replace(config, high_priority_streams=True)
        if engine is None:
            return config
        # Off: no all-reduce is large enough to leave the delegate.
        if engine is False:
            config = config._with_flat_threshold(ENGINE_OFF_THRESHOLD)
        return replace(config, group_engine=engine, cuda_engine=engine)

    def _with_flat_threshold(self, threshold: int | str) -> Config:
        return replace(
            self, flat_threshold=threshold, cpu_flat_threshold_setting=None, cuda_flat_threshold_setting=None
        )

    def must_agree(self) -> dict[str, int | str]:
        """Settings that every rank of a group must share, by variable name."""
        return {
            GROUP_ENGINE: "unset" if self.group_engine is None else str(self.group_engine),
            ENGINE_DISABLE: int(self.engine_disable),
            TOTAL_MEMORY: self.total_memory,
            SLICE_SIZE: self.slice_size,
            MIN_SHARD_SIZE: self.min_shard,
            FLAT_THRESHOLD: _or_unset(self.flat_threshold),
            CPU_FLAT_THRESHOLD: _or_unset(self.cpu_flat_threshold_setting),
            CUDA_FLAT_THRESHOLD: _or_unset(self.cuda_flat_threshold_setting),
            CUDA_ENGINE: AUTO if self.cuda_engine_auto else int(self.cuda_engine),
            RAILS_TRANSPORT: self.rails_transport,
            RAIL_FAILOVER: int(self.rail_failover),
            NIXL_BACKEND: self.nixl_backend if self.rails_transport == "nixl" else "unused",
            SERIALIZED_LAUNCHES: self._cuda_all_reduces_text(),
            # Whether it is set, never the value.
            RAILS_SECRET: int(self.rails_secret is not None),
            RAILS_ENCRYPT: int(self.rails_encrypt),
        }

    def _cuda_all_reduces_text(self) -> str:
        """Where CUDA all-reduces of a group that spans machines go, and why, as must_agree compares it."""
        if not self.cuda_engine:
            return "unused"
        if self.cuda_engine_routed_to_nccl:
            return "nccl: the GPU may run kernels in launch order"
        return "engine"

    def describe(self) -> str:
        return (
            f"{TOTAL_MEMORY}={format_size(self.total_memory)} "
            f"{SLICE_SIZE}={format_size(self.slice_size)} "
            f"{SLICES_IN_FLIGHT}={self.slices_in_flight} "
            f"{MIN_SHARD_SIZE}={format_size(self.min_shard)} "
            f"{FLAT_THRESHOLD}={self._flat_threshold_text()} "
            f"{MACHINE_ID}={self.machine_id or '(discover)'} "
            f"{LOG_LEVEL}={self.log_level or '(unset)'} "
            f"{self.socket_ifname_variable}={self.socket_ifname or '(automatic)'} "
            f"{SOCKET_FAMILY}={self.socket_family or '(either)'} "
            f"{RAIL_INTERFACES}={self._rail_interfaces_text()} "
            f"{CUDA_ENGINE}={AUTO if self.cuda_engine_auto else int(self.cuda_engine)} "
            f"{AUTO_BUDGET}={self.auto_budget_s:g}s "
            f"{AUTO_CACHE}={self.auto_cache or '(off)'} "
            f"{IB_DISABLE}={int(self.ib_disable)} "
            f"{SHM_DISABLE}={int(self.shm_disable)} "
            f"{RAIL_FAILOVER}={int(self.rail_failover)} "
            f"{TIMELINE}={self.timeline_directory or '(off)'} "
            f"{RAILS_TRANSPORT}={self.rails_transport} "
            f"{SERIALIZED_LAUNCHES}={self.serialized_launches} "
            f"(launch order: {self.launch_order_hazard or 'nothing serializes it'}) "
            f"{CUDA_WAIT}={self.cuda_wait} "
            f"{RAILS_SECRET}={'(set)' if self.rails_secret else '(unset: the rails key is met in the store)'} "
            f"{RAILS_ENCRYPT}={int(self.rails_encrypt)}"
            + (f" {NIXL_BACKEND}={self.nixl_backend}" if self.rails_transport == "nixl" else "")
        )

    def _flat_threshold_text(self) -> str:
        if self.cpu_flat_threshold != self.cuda_flat_threshold or self.flat_threshold is None:
            return f"(CPU {threshold_text(self.cpu_flat_threshold)}, CUDA {threshold_text(self.cuda_flat_threshold)})"
        return threshold_text(self.cpu_flat_threshold)

    def _rail_interfaces_text(self) -> str:
        mapping = self.rail_interfaces
        return mapping if isinstance(mapping, str) else ",".join(mapping)


def threshold_text(threshold: int) -> str:
    """A flat threshold as its variable would give it."""
    return AUTO if threshold == MEASURED_THRESHOLD else format_size(threshold)


def load_config(env: Mapping[str, str] | None = None, tensorpipe_built: bool | None = None) -> Config:
    """Reads and validates fairring's variables from `env` (default os.environ).

    `tensorpipe_built`: whether this build has the TensorPipe rails (default: the extension says);
    without them the rails default to NIXL, and asking for TensorPipe fails saying why.
    """
    env = os.environ if env is None else env

    def size(name: str, default: int, allow_zero: bool = False) -> int:
        raw = env.get(name)
        return default if raw is None or raw.strip() == "" else parse_size(name, raw, allow_zero)

    machine_id = env.get(MACHINE_ID)
    if machine_id is not None and machine_id.strip() == "":
        raise ConfigError(
            f"{MACHINE_ID} is set but empty; unset it to discover machines, or give "
            "every rank on one machine the same non-empty id"
        )
    total_memory = size(TOTAL_MEMORY, DEFAULT_TOTAL_MEMORY)
    physical_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if total_memory > physical_memory:
        raise ConfigError(
            f"{TOTAL_MEMORY}={env[TOTAL_MEMORY]!r} is more than this machine's memory "
            f"({format_bytes(physical_memory)}); it bounds fairring's staging per device, which needs "
            f"a few slices' worth (the default is {format_size(DEFAULT_TOTAL_MEMORY)})"
        )
    slice_size = size(SLICE_SIZE, DEFAULT_SLICE_SIZE)
    if slice_size < MIN_SLICE_SIZE:
        raise ConfigError(
            f"{SLICE_SIZE}={env[SLICE_SIZE]!r} is below the smallest slice, {format_size(MIN_SLICE_SIZE)}; "
            f"use {format_size(MIN_SLICE_SIZE)} or more (the default is {format_size(DEFAULT_SLICE_SIZE)})"
        )
    slices_in_flight = _positive_count(env, SLICES_IN_FLIGHT, DEFAULT_SLICES_IN_FLIGHT)
    log_level = env.get(LOG_LEVEL)
    if log_level is not None:
        # Empty means unset, as for every variable; WARN is NCCL_DEBUG's spelling of WARNING.
        log_level = {"": None, "WARN": "WARNING"}.get(log_level.strip().upper(), log_level.strip().upper())
        if log_level is not None and log_level not in _LOG_LEVELS:
            raise ConfigError(f"{LOG_LEVEL}={env[LOG_LEVEL]!r} is not a log level; use one of {', '.join(_LOG_LEVELS)}")
    if tensorpipe_built is None:
        from . import _C

        tensorpipe_built = bool(_C.build_info()["tensorpipe"])
    transports = RAILS_TRANSPORTS if tensorpipe_built else RAILS_TRANSPORTS[::-1]
    rails_transport = _choice(env, RAILS_TRANSPORT, transports, str.lower)
    if rails_transport == "tensorpipe" and not tensorpipe_built:
        raise ConfigError(
            f"{RAILS_TRANSPORT}=tensorpipe, but this fairring was built without TensorPipe (its torch ships "
            f"none, or FAIRRING_WITH_TENSORPIPE=0): unset it or use {RAILS_TRANSPORT}=nixl"
        )
    rail_failover = parse_flag(RAIL_FAILOVER, env.get(RAIL_FAILOVER))
    if rail_failover and rails_transport == "nixl":
        raise ConfigError(
            f"{RAIL_FAILOVER}=1 needs {RAILS_TRANSPORT}=tensorpipe: the NIXL rails cannot stop a write that "
            "stalled on a downed NIC from landing later, so they fail naming the NIC instead "
            f"(docs/networking.md, 'When a NIC goes down'); unset one of the two"
        )
    cuda_engine_auto = _is_auto(env.get(CUDA_ENGINE))
    try:
        cuda_engine = cuda_engine_auto or parse_flag(CUDA_ENGINE, env.get(CUDA_ENGINE))
    except ConfigError as error:
        raise ConfigError(f"{error}; or auto: the engine on where it measures faster than NCCL") from None
    transport = load_transport_settings(env, tensorpipe=rails_transport == "tensorpipe")
    rails_encrypt = parse_flag(RAILS_ENCRYPT, env.get(RAILS_ENCRYPT))
    cuda_wait = _choice(env, CUDA_WAIT, CUDA_WAIT_CHOICES, str.lower)
    check_rails_encrypt(rails_encrypt, rails_transport, cuda_rails_buffers=cuda_engine and cuda_wait == "host")
    return Config(
        total_memory=total_memory,
        slice_size=slice_size,
        slices_in_flight=slices_in_flight,
        flat_threshold=_threshold_setting(env, FLAT_THRESHOLD),
        cpu_flat_threshold_setting=_threshold_setting(env, CPU_FLAT_THRESHOLD),
        cuda_flat_threshold_setting=_threshold_setting(env, CUDA_FLAT_THRESHOLD),
        min_shard=size(MIN_SHARD_SIZE, DEFAULT_MIN_SHARD_SIZE, allow_zero=True),
        machine_id=machine_id.strip() if machine_id else None,
        log_level=log_level,
        **_socket_settings(env, cuda_engine),
        cuda_engine=cuda_engine,
        cuda_engine_auto=cuda_engine_auto,
        auto_budget_s=_auto_budget(env.get(AUTO_BUDGET)),
        auto_cache=_auto_cache(env),
        transport=transport,
        shm_disable=parse_flag(SHM_DISABLE, env.get(SHM_DISABLE)),
        rail_failover=rail_failover,
        timeline_directory=_timeline_directory(env.get(TIMELINE)),
        launcher_attempt=_optional_count(env, RESTART_COUNT),
        rails_transport=rails_transport,
        nixl_backend=_choice(env, NIXL_BACKEND, NIXL_BACKENDS, str.upper),
        launch_order_hazard=launch_order_hazard(env, os.path.exists),
        serialized_launches=_choice(env, SERIALIZED_LAUNCHES, SERIALIZED_LAUNCH_CHOICES, str.lower),
        engine_disable=parse_flag(ENGINE_DISABLE, env.get(ENGINE_DISABLE)),
        cuda_wait=cuda_wait,
        rails_secret=parse_rails_secret(env.get(RAILS_SECRET)),
        rails_encrypt=rails_encrypt,
    )


def launch_order_hazard(env: Mapping[str, str], exists: Callable[[str], bool]) -> str | None:
    """Why this process's GPU may run every kernel in the order it was launched, or None.

    `exists`: whether a path exists (os.path.exists; tests pass their own).
    """
    if env.get(MAX_CONNECTIONS, "").strip() == "1":
        return f"{MAX_CONNECTIONS}=1"
    if env.get(LAUNCH_ORDER_IMPLICIT, "").strip() == "1":
        return f"{LAUNCH_ORDER_IMPLICIT}=1"
    pipes = env.get(MPS_PIPE_DIRECTORY, "").strip() or DEFAULT_MPS_PIPE_DIRECTORY
    control = os.path.join(pipes, "control")
    if exists(control):
        return f"an MPS control daemon runs ({control})"
    return None


def _is_auto(raw: str | None) -> bool:
    return raw is not None and raw.strip().lower() == AUTO


def _auto_budget(raw: str | None) -> float:
    """Seconds: "5", "2.5" or "2.5s"."""
    if raw is None or raw.strip() == "":
        return DEFAULT_AUTO_BUDGET_S
    text = raw.strip().lower().removesuffix("s")
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ConfigError(
            f"{AUTO_BUDGET}={raw!r} is not a time; give seconds above 0, such as 5 or 2.5s "
            f"(the default is {DEFAULT_AUTO_BUDGET_S:g})"
        )
    return seconds


def _auto_cache(env: Mapping[str, str]) -> str | None:
    """The measurement cache's folder: FAIRRING_AUTO_CACHE, "off", or the user's cache folder."""
    raw = env.get(AUTO_CACHE)
    # Every word a flag takes for off ("false", "no", ...), not a folder of that name.
    if raw is not None and (raw.strip().lower() == "none" or _FLAGS.get(raw.strip().lower()) is False):
        return None
    if raw is not None and raw.strip() != "":
        return os.path.abspath(os.path.expanduser(raw.strip()))
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fairring")


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], normalize: Callable[[str], str]) -> str:
    """One of `choices` (the first where `name` is unset), compared after `normalize`."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return choices[0]
    value = normalize(raw.strip())
    if value not in choices:
        raise ConfigError(f"{name}={raw!r} is not one of {', '.join(choices)} (the default is {choices[0]})")
    return value


def _optional_count(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None


def _or_unset(value: int | str | None) -> int | str:
    """A setting as ranks compare it: "unset" counts as a value of its own."""
    return "unset" if value is None else value


def _threshold_setting(env: Mapping[str, str], name: str) -> int | str | None:
    """A flat threshold variable: bytes, "auto", or None where unset."""
    if _is_auto(env.get(name)):
        return AUTO
    try:
        return _optional_size(env, name)
    except ConfigError as error:
        raise ConfigError(f"{error}; or auto: measured at the group's first all-reduce the engine could take") from None


def _optional_size(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    return None if raw is None or raw.strip() == "" else parse_size(name, raw, allow_zero=True)


def _positive_count(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        count = int(raw.strip())
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(f"{name}={raw!r} is not a count; use a whole number of 1 or more (the default is {default})")
    return count


def _timeline_directory(raw: str | None) -> str | None:
    """The timeline folder, made if missing; ConfigError if it cannot be written."""
    if raw is None or raw.strip() == "":
        return None
    folder = os.path.abspath(os.path.expanduser(raw.strip()))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{TIMELINE}={raw!r}: cannot create that folder ({error.strerror})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{TIMELINE}={raw!r}: that folder is not writable; name one that is")
    return folder


def parse_flag(name: str, raw: str | None) -> bool:
    """The switch in `raw`, the value of variable `name` (unset or empty: off)."""
    if raw is None or raw.strip() == "":
        return False
    flag = _FLAGS.get(raw.strip().lower())
    if flag is None:
        raise ConfigError(f"{name}={raw!r} is not a switch; use 1, true, yes or on, or 0, false, no or off")
    return flag


def parse_name_list(
    variable: str, raw: str | None, known: Sequence[str], same_host: Mapping[str, str], kind: str
) -> NameList | None:
    """A list of transports or channels; None where unset or empty."""
    if raw is None or raw.strip() == "":
        return None
    text = raw.strip()
    exclude = text.startswith("^")
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.removeprefix("^").split(",") if n.strip()))
    help_text = f"a comma-separated list of {', '.join(known)}, or ^ and the ones to leave out (e.g. ^{known[0]})"
    if not names:
        raise ConfigError(f"{variable}={raw!r} names no {kind}; expected {help_text}")
    for name in names:
        if name in same_host:
            raise ConfigError(
                f"{variable}={raw!r}: {name} moves data through {same_host[name]}, but {_SAME_HOST} "
                f"{kind}s: {', '.join(known)}"
            )
        if name in NOT_OFFERED_CHANNELS and kind == "channel":
            raise ConfigError(f"{variable}={raw!r}: {NOT_OFFERED_CHANNELS[name]}; known: {', '.join(known)}")
        if name not in known:
            raise ConfigError(f"{variable}={raw!r}: unknown {kind} {name!r}; expected {help_text}")
    return NameList(variable, raw, names, exclude)


def parse_transports(raw: str | None) -> NameList | None:
    transports = parse_name_list(TRANSPORTS, raw, NETWORK_TRANSPORTS, SAME_HOST_TRANSPORTS, "transport")
    if transports is not None and transports.exclude and "uv" in transports.names:
        raise ConfigError(
            f"{TRANSPORTS}={raw!r}: uv cannot be left out: every rails pipe connects over TCP first and then "
            f"moves to the best transport both ends offer. To require InfiniBand, list it: {TRANSPORTS}=ibv"
        )
    return transports


def parse_channels(raw: str | None) -> NameList | None:
    channels = parse_name_list(CHANNELS, raw, CPU_CHANNELS + CUDA_CHANNELS, SAME_HOST_CHANNELS, "channel")
    if channels is not None and channels.exclude:
        for kind, candidates in (("CPU", CPU_CHANNELS), ("CUDA", CUDA_CHANNELS)):
            if all(name in channels.names for name in candidates):
                raise ConfigError(
                    f"{CHANNELS}={raw!r} leaves no channel for {kind} buffers; the rails need one of "
                    f"{', '.join(candidates)}"
                )
    return channels


def parse_ib_hca(raw: str | None, tensorpipe: bool = True, variable: str = IB_HCA) -> HcaSelection | None:
    """FAIRRING_IB_HCA: as NCCL_IB_HCA, ^ (exclude) then = (exact names) apply to the whole list.

    Any port may be selected for the NIXL rails (`tensorpipe` false); TensorPipe's use only port 1.
    `variable` names where `raw` came from, in messages.
    """
    if raw is None or raw.strip() == "":
        return None
    setting = f"{variable}={raw!r}"
    # Where NCCL's variable is refused, fairring's own lets NCCL keep it.
    override = f"; or set {IB_HCA} to choose the rails' devices apart from NCCL's" if variable != IB_HCA else ""
    exclude, exact, listed = split_list(raw)
    help_text = (
        "comma-separated device[:port] entries matched as name prefixes, a leading = for exact names, "
        "a leading ^ to exclude them (e.g. mlx5, =mlx5_0:1,mlx5_1:1 or ^=mlx5_1)"
    )
    entries = []
    for entry in listed:
        name, _, port_text = entry.partition(":")
        name = name.strip()
        if not name:
            raise ConfigError(f"{setting} has an empty entry; expected {help_text}{override}")
        if name.startswith(("=", "^")):
            raise ConfigError(
                f"{setting}: ^ and = apply to the whole list and come first (^=mlx5_0,mlx5_1); "
                f"expected {help_text}{override}"
            )
        port = None
        if port_text:
            if not port_text.strip().isdigit() or int(port_text) < 1:
                raise ConfigError(f"{setting}: {port_text!r} is not a port number; expected {help_text}{override}")
            port = int(port_text)
        # Leaving another port out is what TensorPipe does anyway; using one it cannot.
        if tensorpipe and port not in (None, TENSORPIPE_PORT) and not exclude:
            raise ConfigError(
                f"{setting}: port {port} of {name} cannot be used: torch's TensorPipe always uses port "
                f"{TENSORPIPE_PORT} (tensorpipe/transport/ibv/constants.h kPortNum); select {name}:1 or {name}, "
                f"or use the NIXL rails (FAIRRING_RAILS_TRANSPORT=nixl), which can use any port{override}"
            )
        entries.append((name, port))
    return HcaSelection(raw, tuple(entries), exclude, exact, variable)


def parse_gid_index(raw: str | None, tensorpipe: bool = True) -> int | None:
    """FAIRRING_IB_GID_INDEX; None where unset. The TensorPipe rails can honour only their own, 0."""
    if raw is None or raw.strip() == "":
        return None
    if not tensorpipe:
        if not raw.strip().isdigit():
            raise ConfigError(f"{IB_GID_INDEX}={raw!r} is not a GID index; expected a number such as 3")
        return int(raw)
    if raw.strip() != str(TENSORPIPE_GID_INDEX):
        raise ConfigError(
            f"{IB_GID_INDEX}={raw!r} cannot be honoured: torch's TensorPipe always uses GID index "
            f"{TENSORPIPE_GID_INDEX} (tensorpipe/transport/ibv/constants.h kGlobalIdentifierIndex); unset it "
            f"or use 0. Where GID 0 does not reach the peers (e.g. RoCE v2 routed fabrics) use the NIXL rails "
            f"(FAIRRING_RAILS_TRANSPORT=nixl), which honour it, or TCP: {TRANSPORTS}=uv"
        )
    return TENSORPIPE_GID_INDEX


def load_transport_settings(env: Mapping[str, str] | None = None, tensorpipe: bool = True) -> TransportSettings:
    """Reads and validates the rails' transport variables from `env` (default os.environ).

    `tensorpipe`: for the TensorPipe rails, which use only port 1 and GID index 0 of a device.
    """
    env = os.environ if env is None else env
    return TransportSettings(
        transports=parse_transports(env.get(TRANSPORTS)),
        channels=parse_channels(env.get(CHANNELS)),
        ib_hca=_ib_hca(env, tensorpipe),
        ib_disable=parse_flag(IB_DISABLE, env.get(IB_DISABLE)),
        gid_index=parse_gid_index(env.get(IB_GID_INDEX), tensorpipe),
    )


def _ib_hca(env: Mapping[str, str], tensorpipe: bool) -> HcaSelection | None:
    """FAIRRING_IB_HCA, else NCCL_IB_HCA: the devices an NCCL job already chose."""
    for variable in (IB_HCA, NCCL_IB_HCA):
        raw = env.get(variable)
        if raw is not None and raw.strip() != "":
            return parse_ib_hca(raw, tensorpipe, variable)
    return None


def _socket_settings(env: Mapping[str, str], cuda_engine: bool) -> dict[str, object]:
    """The rails' interfaces: FAIRRING_SOCKET_IFNAME, else TP_SOCKET_IFNAME (exact names), else the job's own.

    The job's own: where the CUDA engine is off the rails carry CPU tensors, in place of Gloo's, so
    GLOO_SOCKET_IFNAME (exact names) comes before NCCL_SOCKET_IFNAME; with it on, the other way round.
    """
    settings: dict[str, object] = {
        "socket_family": parse_family(env.get(SOCKET_FAMILY)),
        "rail_interfaces": parse_rail_interfaces(env.get(RAIL_INTERFACES)),
    }
    jobs = [(GLOO_SOCKET_IFNAME, True), (NCCL_SOCKET_IFNAME, False)]
    for variable, exact in [(SOCKET_IFNAME, False), (TP_SOCKET_IFNAME, True), *(jobs[::-1] if cuda_engine else jobs)]:
        raw = env.get(variable)
        if raw is not None and raw.strip() != "":
            settings["socket_ifname"] = parse_interface_filter(variable, raw, exact=exact)
            settings["socket_ifname_variable"] = variable
            break
    return settings


def parse_dump_signal(raw: str | None) -> int | None:
    """FAIRRING_DUMP_SIGNAL: the signal that makes fairring print its pending ops; None where unset."""
    if raw is None or raw.strip() == "":
        return None
    name = raw.strip().upper().removeprefix("SIG")
    if name not in DUMP_SIGNALS:
        raise ConfigError(
            f"{DUMP_SIGNAL}={raw!r} is not a signal fairring may take; use {' or '.join(DUMP_SIGNALS)} "
            "(e.g. FAIRRING_DUMP_SIGNAL=USR2, then kill -USR2 <pid>)"
        )
    return int(getattr(signal, f"SIG{name}"))
