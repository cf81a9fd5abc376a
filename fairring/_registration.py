"""Creates fairring backends for torch.distributed and registers the name."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from . import _C
from ._auto_threshold import measure_flat_threshold
from ._config import (
    AUTO,
    CUDA_ENGINE,
    CUDA_WAIT,
    ENGINE_DISABLE,
    IB_HCA,
    SERIALIZED_LAUNCHES,
    SLICE_SIZE,
    SLICES_IN_FLIGHT,
    TOTAL_MEMORY,
    Config,
    ConfigError,
    load_config,
)
from ._dispatch import Decision, Run
from ._errors import dist_error_like
from ._free_memory import gpu_cached_bytes
from ._infiniband import fork_safety_set_by_fairring
from ._interfaces import GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, SOCKET_IFNAME
from ._known_variables import warn_unknown_variables
from ._log import apply_log_level
from ._options import Options, group_options, nccl_options
from ._plan_log import describe_plans, floor_advice, plan_of
from ._rails_network import rails_network
from ._rendezvous import rendezvous
from ._shared_memory import shared_memory_steps
from ._sizes import format_size
from ._summary import log_at_shutdown
from ._topology import TopologyError, identify_self

logger = logging.getLogger("fairring")

BACKEND_NAME = "fairring"
_logged_config = False
_noticed: set[str] = set()


def _create_backend(dist_options: Any, backend_options: Any) -> dist.Backend:
    """torch's extended-API creator: one backend per process group; `backend_options` is pg_options.

    init_process_group(enable_reconfigure=True) (torch >= 2.15) makes a group
    whose members reconfigure() sets: each set gets a fairring backend of its own.
    """
    group_name = str(dist_options.group_id)
    options = group_options(backend_options)
    if getattr(dist_options, "enable_reconfigure", False):

        def make_backend(store: dist.Store, rank: int, size: int, timeout: timedelta) -> _C.Backend:
            return create_backend(store, rank, size, timeout, group_name, options)

        return _C.ReconfigurableBackend(
            dist_options.store, dist_options.group_rank, dist_options.group_size, dist_options.timeout, make_backend
        )
    return create_backend(
        dist_options.store,
        dist_options.group_rank,
        dist_options.group_size,
        dist_options.timeout,
        group_name,
        options,
    )


def create_backend(
    store: dist.Store,
    rank: int,
    size: int,
    timeout: timedelta,
    group_name: str,
    options: Options | None = None,
    cuda_delegate: dist.Backend | None = None,
) -> _C.Backend:
    """A fairring backend for rank `rank` of a group of `size` ranks meeting in `store`.

    Costs about what a Gloo group costs: the engine, its local groups, rails
    and staging are made by the group's first all-reduce that needs them.
    `cuda_delegate`: the NCCL group it delegates to, already made (a shrink's).
    """
    global _logged_config
    options = Options() if options is None else options
    env_config = load_config()
    apply_log_level(env_config.log_level, rank)
    warn_unknown_variables(os.environ)
    if not _logged_config:
        logger.debug("effective configuration: %s", env_config.describe())
        log_inherited_settings(env_config)
        _logged_config = True
    high_priority = options.nccl is not None and bool(options.nccl.is_high_priority_stream)
    config = env_config.with_group_options(options.engine, options.flat_threshold, high_priority)
    check_cuda_path(env_config, config, bool(_C.build_info()["cuda_path"]), torch.version.cuda is not None)
    warn_if_engine_disabled(config)
    warn_if_routed_to_nccl(config)
    log_if_host_waits(config)
    if config.launcher_attempt is not None:
        store = dist.PrefixStore(f"fairring-attempt{config.launcher_attempt}/", store)

    view = rendezvous(store, rank, size, identify_self(config), config.must_agree(), timeout)
    topology = _C.Topology(
        view.rank,
        view.world_size,
        view.machine,
        list(view.local_ranks),
        list(view.rail_peers),
        list(view.machine_sizes),
    )
    logger.debug("group %s: %s", group_name, topology)
    log_if_never_on_engine(group_name, topology)
    check_staging_fits(config, topology)
    log_plans(config, topology)

    # The CPU group: Gloo, in its own key space of the group's store.
    cpu_backend = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
    network = rails_network(config, topology)
    return _C.Backend(
        store,
        topology,
        _C.Config.from_settings(config, network),
        timeout,
        cpu_backend,
        InnerGroups(store, topology, timeout, config, options, cpu_backend, network, cuda_delegate),
    )


def log_inherited_settings(config: Config) -> None:
    """Once, at INFO: settings fairring took from NCCL's variables, and the process-wide ones it made."""
    if config.socket_ifname_variable in (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME):
        logger.info(
            "the rails use the interfaces %s=%s selects; set %s to choose them apart from %s's",
            config.socket_ifname_variable,
            config.socket_ifname,
            SOCKET_IFNAME,
            "NCCL" if config.socket_ifname_variable == NCCL_SOCKET_IFNAME else "Gloo",
        )
    hca = config.transport.ib_hca
    if hca is not None and not hca.explicit:
        logger.info(
            "the rails may use the InfiniBand devices %s selects; set %s to choose them apart", hca.setting(), IB_HCA
        )
    made = fork_safety_set_by_fairring()
    if made:
        logger.info(
            "fairring set %s for this process at import: libibverbs' fork protection, so that forked workers "
            "(DataLoader) do not corrupt memory the rails registered; set them before importing fairring to choose",
            " and ".join(f"{name}=1" for name in made),
        )


def check_cuda_path(env_config: Config, config: Config, cuda_path: bool, torch_cuda: bool) -> None:
    """FAIRRING_CUDA_ENGINE=1 or auto on a CUDA torch, in a build without the CUDA path, fails the group's init.

    The engine's first CUDA all-reduce would fail there (device/cuda_none.cpp), so say it now, with the
    rebuild. `env_config`: the variables; `config`: the group's, its fairring.Options applied. Nothing is said
    where the engine is not asked for (the default): CUDA tensors go to NCCL, as they would anyway. A group's
    Options(engine=True) alone is not checked here: it serves CPU tensors too, and a group does not know at
    init whether it will see CUDA ones; its first CUDA all-reduce on the engine fails, advising the rebuild.
    """
    if cuda_path or not torch_cuda or not env_config.cuda_engine or config.engine_off:
        return
    setting = AUTO if env_config.cuda_engine_auto else "1"
    raise ConfigError(
        f"{CUDA_ENGINE}={setting} asks for the CUDA engine, but this fairring was built without its CUDA path "
        f"(fairring.build_info()['cuda_path'] is False) although torch {torch.__version__} has CUDA. Rebuild it "
        "in this environment with `FAIRRING_WITH_CUDA=1 pip install --no-build-isolation .`, which fails saying "
        f"what the build is missing (docs/configuration.md#building), or unset {CUDA_ENGINE} to leave CUDA "
        "all-reduces to NCCL."
    )


def warn_if_engine_disabled(config: Config) -> None:
    """Once per process, at WARNING: FAIRRING_ENGINE_DISABLE=1 keeps every group off the engine."""
    if config.engine_disable and _first_time("disabled"):
        logger.warning(
            "%s=1: no fairring group uses the engine, whatever its fairring.Options say; collectives go to Gloo "
            "(CPU tensors) and NCCL (CUDA tensors), as without fairring. Unset it to use the engine again.",
            ENGINE_DISABLE,
        )


def warn_if_routed_to_nccl(config: Config) -> None:
    """Once per process, at WARNING: the CUDA engine is asked for, but its all-reduces go to NCCL."""
    if config.cuda_engine_routed_to_nccl and _first_time("serialized"):
        logger.warning(
            "CUDA all-reduces go to NCCL, not the engine: %s, so this GPU may run every kernel in the order "
            "it was launched, where the engine's launches, timed by the network, could deadlock against another "
            "communicator's (tensor- or pipeline-parallel groups, another fairring group). If no other "
            "communicator has collectives in flight while this group's all-reduces are, set %s=engine to keep "
            "them on the engine (docs/design.md, 'Serialized launches').",
            config.launch_order_hazard,
            SERIALIZED_LAUNCHES,
        )


def log_if_host_waits(config: Config) -> None:
    """Once per process, at INFO: that wait() on a CUDA engine op holds the host (FAIRRING_CUDA_WAIT=host,
    where ProcessGroupNCCL's holds only the stream)."""
    if config.cuda_engine_in_use and config.cuda_wait == "host" and _first_time("host wait"):
        logger.info(
            "wait() on a CUDA engine op, and a synchronous one, hold the host until the op's result is back "
            "from the network, where NCCL's hold only the caller's stream (%s=host; docs/design.md, 'The host "
            "never waits')",
            CUDA_WAIT,
        )


def _first_time(notice: str) -> bool:
    """Whether this process has not yet given `notice` (and, from now on, has)."""
    if notice in _noticed:
        return False
    _noticed.add(notice)
    return True


def log_if_never_on_engine(group_name: str, topology: _C.Topology) -> None:
    """At INFO, from the group's rank 0: a group whose layout keeps every collective off the engine says so.

    These are the groups whose users wonder why nothing changed; path_for and the summary's by_reason say
    it per op (irregular_group).
    """
    if topology.serves_engine or topology.world_size == 1 or topology.rank != 0:
        return
    sizes = list(topology.machine_sizes)
    logger.info(
        "group %s: ranks on %d machine(s) of %s rank(s): the engine needs 2 or more machines of equally many "
        "ranks, so this group's collectives all go to the delegate (gloo for CPU tensors, nccl for CUDA)",
        group_name,
        len(sizes),
        ", ".join(map(str, sizes)),
    )


def check_staging_fits(config: Config, topology: _C.Topology) -> None:
    """The staging pool must hold at least one slice; say which variable to change if not."""
    if not topology.serves_engine or config.engine_off:
        return  # no engine, no staging
    needed = _C.staging_bytes_for(config.slice_size, topology.local_size, topology.num_machines)
    if config.total_memory < needed:
        raise ConfigError(
            f"{TOTAL_MEMORY}={format_size(config.total_memory)} cannot hold one slice in flight: with "
            f"{SLICE_SIZE}={format_size(config.slice_size)} and {topology.local_size} rank(s) per machine a "
            f"slice needs {format_size(needed)} of staging. Raise {TOTAL_MEMORY} to at least {needed} bytes "
            f"or lower {SLICE_SIZE}."
        )


def check_device_memory(config: Config, topology: _C.Topology, device: torch.device) -> None:
    """The CUDA engine's staging must fit in what the GPU has free when it is made; say what to change if not."""
    staging = plan_of(config.slice_size, config, topology, "cuda")["staging_capacity"]
    free, total = torch.cuda.mem_get_info(device)
    cached = gpu_cached_bytes(device)
    if staging > free + cached:
        memory = format_size(config.total_memory)
        raise ConfigError(
            f"the CUDA engine's staging ({format_size(staging)}, from {TOTAL_MEMORY}={memory} "
            f"and {SLICE_SIZE}={format_size(config.slice_size)}) does not fit in the {format_size(free + cached)} "
            f"free of {device}'s {format_size(total)} ({format_size(cached)} of it cached by torch's allocator): "
            f"lower {TOTAL_MEMORY} or {SLICES_IN_FLIGHT}, or make the group (with device_id, or its first CUDA "
            "collective) before the model takes the GPU's memory"
        )


def log_plans(config: Config, topology: _C.Topology) -> None:
    """At DEBUG, the plan of each size class; on rank 0, a warning if large ones are over-sharded."""
    if not topology.serves_engine or config.engine_off:
        return
    for device in ("cpu", "cuda") if config.cuda_engine_in_use else ("cpu",):
        if logger.isEnabledFor(logging.DEBUG):
            lines = describe_plans(config, topology, device)
            logger.debug("rank %d: %s all-reduces of float32 take:\n  %s", topology.rank, device, "\n  ".join(lines))
        advice = floor_advice(config, topology, device)
        if advice is not None and topology.rank == 0:
            logger.warning("%s all-reduces: %s", device, advice)


class InnerGroups:
    """Makes the inner groups a fairring backend needs, with torch's own constructors.

    The C++ backend calls these at moments every rank reaches in the same
    order (the first CUDA collective, the first all-reduce the engine serves on
    a device, split_group), so every rank makes the same groups in the same order.
    """

    def __init__(
        self,
        store: dist.Store,
        topology: _C.Topology,
        timeout: timedelta,
        config: Config,
        options: Options,
        cpu_backend: dist.Backend,
        network: _C.RailsNetwork,
        cuda_delegate: dist.Backend | None = None,
    ) -> None:
        self._store = store
        self._topology = topology
        self._timeout = timeout
        self._config = config
        # The group's pg_options: split_group's children inherit them, as NCCL's do.
        self._options = options
        self._cpu_backend = cpu_backend
        self._network = network
        self._cuda_delegate = cuda_delegate

    def delegate(self, device_type: str) -> dist.Backend:
        """The group over every rank for tensors of `device_type` other than the CPU: NCCL."""
        if device_type != "cuda":
            raise ValueError(f"fairring: no delegate group for {device_type} tensors")
        if self._cuda_delegate is not None:
            made, self._cuda_delegate = self._cuda_delegate, None
            return made
        if not torch.cuda.is_available():
            raise RuntimeError("fairring: a CUDA tensor was passed but this process sees no CUDA device")
        topology = self._topology
        return self._nccl(dist.PrefixStore("nccl/", self._store), topology.rank, topology.world_size)

    def local_groups(self, device: str) -> tuple[dist.Backend | None, dist.Backend | None, _C.SharedMemorySteps | None]:
        """What runs the engine's local steps over this machine's ranks.

        On CPU, shared memory where every rank of the machine can map every
        other's (fairring/_shared_memory.py). Else a group per step: each step is
        fed by its own engine thread, so each needs its own group, as two
        threads sharing one could interleave their operations differently on
        different ranks. CUDA groups are bound to `device` and connected here,
        one after the other, before the engine's threads use them. All None
        where there is nothing to do locally.
        """
        topology = self._topology
        target = torch.device(device)
        if target.type == "cuda":
            check_device_memory(self._config, topology, target)
        if not topology.serves_engine or topology.local_size == 1:
            return None, None, None
        if target.type == "cpu":
            steps = shared_memory_steps(self._store, topology, self._config.shm_disable, self._timeout)
            if steps is not None:
                return None, None, steps
        groups = []
        for step in ("reduce-scatter", "all-gather"):
            prefix = f"fairring/machine{topology.machine}/{step}/{target.type}/"
            store = dist.PrefixStore(prefix, self._store)
            if target.type == "cpu":
                groups.append(dist.ProcessGroupGloo(store, topology.local_rank, topology.local_size, self._timeout))
                continue
            group = self._nccl(store, topology.local_rank, topology.local_size)
            if hasattr(group, "bound_device_id"):
                group.bound_device_id = target
            group.eager_connect_single_device(target)
            groups.append(group)
        if target.type != "cpu":
            connect_local_groups(groups[0], groups[1], target, topology.local_size, self._config.slice_size)
        logger.debug("machine %d: local groups for %s made and connected", topology.machine, device)
        return groups[0], groups[1], None

    def measure_flat_threshold(self, device: str, collective: str, run: Run) -> Decision:
        """FAIRRING_FLAT_THRESHOLD=auto: the threshold for `device`'s `collective`s, the same on every rank."""
        topology = self._topology
        return measure_flat_threshold(
            torch.device(device), collective, run, self._cpu_backend, self._store, topology, self._config, self._network
        )

    def layout(self) -> list[list[int]]:
        """The group's ranks by machine and local index, gathered over the CPU group.

        A rank's view holds only its machine and its rail (fairring/_rendezvous.py); the
        engine's reduce-scatter and all-gather place every rank's chunk, so their first
        use gathers the rest: one small all-gather, not a read of every rank's record
        from the store.
        """
        topology = self._topology
        mine = torch.tensor([topology.machine, topology.local_rank], dtype=torch.int64)
        places = [torch.empty(2, dtype=torch.int64) for _ in range(topology.world_size)]
        self._cpu_backend.allgather([places], [mine]).wait()
        machines = [[-1] * topology.local_size for _ in range(topology.num_machines)]
        for rank, (machine, local) in enumerate(place.tolist() for place in places):
            machines[machine][local] = rank
        return machines

    def engine_made(self, device: str, rails: str, held: str) -> None:
        topology = self._topology
        logger.info("rank %d: engine on %s holds %s", topology.rank, device, held)
        logger.debug("rank %d: engine on %s made; rails listen on %s", topology.rank, device, rails)

    def notice_once(self, text: str) -> None:
        """A route or fallback the group took, said at INFO once per process for each text."""
        if _first_time(text):
            logger.info("rank %d: %s", self._topology.rank, text)

    def shutting_down(self, backend: _C.Backend) -> None:
        """destroy_process_group: what the group's collectives went through (fairring/_summary.py)."""
        log_at_shutdown(backend, self._config)

    def split(self, store: dist.Store, ranks: list[int], timeout: timedelta, group_name: str) -> _C.Backend:
        """A fairring backend for the group of `ranks` (of this group), this rank among them."""
        return create_backend(store, ranks.index(self._topology.rank), len(ranks), timeout, group_name, self._options)

    def shrink(
        self, survivors: list[int], timeout: timedelta, key: str, cuda_delegate: dist.Backend | None
    ) -> _C.Backend:
        """A fairring backend for this group's `survivors`, made by them alone (shrink_group)."""
        old = self._topology
        excluded = sorted(set(range(old.world_size)) - set(survivors))
        try:
            backend = create_backend(
                dist.PrefixStore(f"fairring/shrink/{key}/", self._store),
                survivors.index(old.rank),
                len(survivors),
                timeout,
                f"shrunk without {excluded}",
                self._options,
                cuda_delegate,
            )
        except TopologyError as error:
            absent = [survivors[rank] for rank in error.missing]
            raise TopologyError(
                f"fairring: rank {old.rank} shrank its group of {old.world_size} without rank(s) {excluded}, but "
                f"rank(s) {absent} did not shrink it alike within {timeout}: every rank that remains must call "
                "shrink_group with the same ranks_to_exclude (a rank that failed meanwhile must be excluded too)",
                absent,
            ) from error
        except RuntimeError as error:
            # Gloo's connection errors name an address, not a rank: say what was under way.
            raise dist_error_like(
                error,
                f"fairring: rank {old.rank}'s shrink of its group of {old.world_size} without rank(s) {excluded} "
                f"failed while the ranks that remain, {survivors}, connected ({error}); one of them failed during "
                "the shrink: exclude it too and shrink again",
            ) from error
        log_shrunk(backend.topology, excluded)
        return backend

    def _nccl(self, store: dist.Store, rank: int, size: int) -> dist.Backend:
        return dist.ProcessGroupNCCL(store, rank, size, nccl_options(self._options.nccl, self._timeout))


def log_shrunk(topology: _C.Topology, excluded: list[int]) -> None:
    """On the shrunk group's rank 0: its layout, and whether its collectives stay on the engine."""
    if topology.rank != 0:
        return
    sizes = list(topology.machine_sizes)
    if topology.serves_engine:
        where = "its all-reduces, reduce-scatters and all-gathers stay on the engine"
    elif topology.num_machines == 1:
        where = "one machine: every collective goes to gloo/nccl"
    else:
        where = "machines hold different numbers of ranks: every collective goes to gloo/nccl"
    logger.info(
        "group shrunk without rank(s) %s: %d rank(s) on %d machine(s) of %s; %s",
        excluded,
        topology.world_size,
        topology.num_machines,
        sizes,
        where,
    )


def connect_local_groups(
    reduce_scatter: dist.Backend, all_gather: dist.Backend, device: torch.device, local_size: int, slice_bytes: int
) -> None:
    """Connects the local groups' peers now, with the operations their steps run, at each size class.

    NCCL connects a communicator's peers at its first collective of each kind
    (NCCL_RUNTIME_CONNECT, its default), and for each algorithm and protocol
    at the first size that picks it. Left to the engine's stage threads, one
    group would connect while the other's kernel spins on the same GPU. Here,
    before those threads exist, every rank of the machine runs the same
    operations in the same order (csrc/local/group_steps.cpp's: an all-to-all
    on the reduce-scatter group, an all-gather on the other) at the sizes of
    warmup_sizes(), then waits for the last of them on an event: not for the
    whole device, which other work of the process may keep busy.
    """
    for total in warmup_sizes(slice_bytes, local_size):
        shard = total // local_size
        source = torch.zeros(total, dtype=torch.uint8, device=device)
        received = torch.empty_like(source)
        reduce_scatter.alltoall_base(received, source, [], []).wait()
        all_gather._allgather_base(received, source[:shard]).wait()
    if device.type == "cuda":
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(device))
        done.synchronize()


# The smallest and a middle size class of the local steps' warm-up: about where NCCL moves from its
# LL protocol to LL128 and from LL128 to Simple on one node (it tunes by size and topology).
WARMUP_SMALL_BYTES = 4096
WARMUP_MIDDLE_BYTES = 256 * 1024


def warmup_sizes(slice_bytes: int, local_size: int) -> list[int]:
    """The bytes of each warm-up operation, whole multiples of `local_size`, smallest first, up to a slice."""
    sizes = []
    for wanted in (WARMUP_SMALL_BYTES, WARMUP_MIDDLE_BYTES, slice_bytes):
        total = max(local_size, min(wanted, slice_bytes) // local_size * local_size)
        if total not in sizes:
            sizes.append(total)
    return sizes


def register() -> None:
    """Makes "fairring" a torch.distributed backend name, for CPU and CUDA."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"])
