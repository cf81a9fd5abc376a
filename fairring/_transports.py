"""Which TensorPipe transports and channels the rails use, and why.

The rails connect ranks on different machines, so only network transports
(ibv: InfiniBand verbs, uv: TCP) and network channels (basic for CPU buffers;
cuda_gdr: GPUDirect RDMA, cuda_basic: staged through host memory, for CUDA
buffers) are candidates. `decide` is a pure function of the variables
(parsed once, into fairring._config's TransportSettings) and the host's facts
(fairring._infiniband); `rails_transports` runs it on this process. The C++ mesh registers exactly what it returns.

What torch's TensorPipe can and cannot do (pytorch/tensorpipe at 2b4cd91, whose
create() signatures torch 2.15's headers under torch/include/tensorpipe share):
- transport::ibv::create() takes no argument and opens the device at once:
  deviceList[0] of ibv_get_device_list, port 1, GID index 0
  (tensorpipe/transport/ibv/reactor.cc, Reactor::Reactor; constants.h kPortNum,
  kGlobalIdentifierIndex). isViable() is false where libibverbs.so.1 cannot be
  loaded, the kernel module is missing (ENOSYS) or no device is listed
  (transport/ibv/context_impl.cc, ContextImpl::create); other listing errors
  throw, and nothing looks at the port's state (common/ibv.cc, makeIbvAddress).
- channel::cuda_gdr::create(optional<vector<string>> gpuIdxToNicName) takes
  each GPU index's device name; a map whose length is not cudaGetDeviceCount,
  or that names an unlisted device, throws. Without a map it gives each GPU
  the device, among all listed, with the longest common PCI path prefix
  (channel/cuda_gdr/context_impl.cc, matchGpusToIbvNics), throwing where a
  device has no PCI path. It too uses port 1 and GID index 0
  (channel/cuda_gdr/constants.h). isViable() needs libcuda, libibverbs, a
  registered peer-memory client (/sys/kernel/mm/memory_peers/{nv_mem,
  nvidia-peermem}/version), a device, and every GPU's BAR1 at least as large
  as its memory (ContextImpl::create).
- Context::registerTransport/registerChannel skip what is not viable, with
  only a verbose log line, and order by priority, highest first
  (core/context_impl.cc).
- A pipe connects over the transport of the URL it dials (core/pipe_impl.cc,
  the client PipeImpl constructor): the rails dial uv URLs. The listening side
  then picks the highest-priority transport that both ends registered and it
  listens on (selectTransport) and moves the pipe there; channels are picked
  per device pair the same way (selectChannels). So uv stays registered, as
  bootstrap and fallback, and ibv/cuda_gdr carry data only where both ends
  offer them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from ._config import (
    CHANNELS,
    CPU_CHANNELS,
    CUDA_CHANNELS,
    IB_DISABLE,
    IB_HCA,
    NETWORK_TRANSPORTS,
    NIXL_BACKEND,
    RAILS_TRANSPORT,
    TENSORPIPE_PORT,
    TRANSPORTS,
    ConfigError,
    HcaSelection,
    NameList,
    TransportSettings,
)
from ._infiniband import (
    FORK_SAFE_VARIABLES,
    LIBIBVERBS,
    PEER_MEMORY_FOLDER,
    ForkFacts,
    HostFacts,
    IbDevice,
    probe_host,
    probe_verbs,
    visible_gpu_bus_ids,
)


@dataclass(frozen=True)
class RailsTransports:
    """What the rails register, best first, and why.

    `transports` always ends with uv, the transport pipes connect over first.
    `cuda_channels` is empty where the process moves no CUDA buffers. The C++
    mesh fails init if a `required` one is not viable by TensorPipe's
    isViable(), and skips, with a log line, an unrequired one that is not.
    """

    transports: tuple[str, ...]
    cpu_channels: tuple[str, ...]
    cuda_channels: tuple[str, ...]
    # For channel::cuda_gdr::create: the device of each GPU index; None: TensorPipe's choice.
    gdr_nics: tuple[str, ...] | None
    # The device the ibv transport opens (deviceList[0]) where ibv is used.
    ib_device: str | None
    # Named explicitly in FAIRRING_TRANSPORTS / FAIRRING_CHANNELS.
    required: frozenset[str]
    # (what, why), one per transport, channel and setting considered.
    reasons: tuple[tuple[str, str], ...]

    def reason(self, name: str) -> str:
        return next(why for what, why in self.reasons if what == name)

    def describe(self) -> str:
        required = f"; required: {', '.join(sorted(self.required))}" if self.required else ""
        return (
            f"rails transports {', '.join(self.transports)}; channels {', '.join(self.cpu_channels)} for CPU, "
            f"{', '.join(self.cuda_channels) or 'none'} for CUDA buffers{required}"
            + "".join(f" | {what}: {why}" for what, why in self.reasons)
        )


def fork_verdict(fork: ForkFacts) -> tuple[bool, str]:
    """Whether fork() stays safe once InfiniBand is initialised in this process, and why."""
    fix = (
        "import fairring before anything that loads libibverbs, or export RDMAV_FORK_SAFE=1 before "
        "starting Python; or keep the rails on TCP"
    )
    note = "".join(
        f" ({name}={value!r} does not turn it off: libibverbs enables it whenever the variable exists)"
        for name, value in fork.user_values
        if value.strip().lower() in ("0", "false", "no", "off")
    )
    if fork.status == "unneeded":
        return True, "safe: the kernel copies RDMA-pinned pages on fork (ibv_is_fork_initialized: UNNEEDED)"
    if fork.status == "enabled":
        return True, f"safe: libibverbs' fork protection is on{note}"
    if not fork.present:
        return False, f"not fork-safe: neither {' nor '.join(FORK_SAFE_VARIABLES)} is set; {fix}"
    if fork.preloaded:
        return False, (
            f"not fork-safe: {LIBIBVERBS} was loaded before fairring set {FORK_SAFE_VARIABLES[0]}, so it may "
            f"have initialised without fork protection; {fix}"
        )
    if fork.status == "disabled":
        return False, (
            "not fork-safe: libibverbs reports fork protection off (ibv_fork_init failed: memory was "
            f"registered before it was requested); {fix}"
        )
    return True, f"safe: {' and '.join(fork.present)} set before libibverbs initialises{note}"


def decide(settings: TransportSettings, facts: HostFacts, cuda: bool) -> RailsTransports:
    """The rails' transports and channels for a process whose rails move CUDA buffers if `cuda`.

    Raises ConfigError where a transport or channel named in the settings cannot
    be used, or FAIRRING_IB_HCA selects no device.
    """
    why_not, required = _allowed(settings)
    if not cuda:
        required -= frozenset(CUDA_CHANNELS)  # nothing to require them for
    reasons: list[tuple[str, str]] = []
    hca = settings.ib_hca
    if hca is not None:
        uses_ib = why_not["ibv"] is None or (cuda and why_not["cuda_gdr"] is None)
        reasons.append((hca.variable, _check_hca(hca, facts) if uses_ib else "not used: the rails use no InfiniBand"))
    fork_ok, fork_why = fork_verdict(facts.fork)
    blocker = _ib_blocker(facts)

    ib_device, ibv_why = _ibv(
        why_not["ibv"], blocker, facts, hca, explicit="ibv" in required or (hca is not None and hca.explicit)
    )
    if ib_device is not None and not fork_ok:
        ib_device, ibv_why = None, fork_why
    if ib_device is None and "ibv" in required:
        raise ConfigError(f"{_setting(settings.transports)} requires ibv, but the rails cannot use it here: {ibv_why}")
    reasons.append(("ibv", f"used: {ibv_why}" if ib_device is not None else f"not used: {ibv_why}"))
    if ib_device is not None:
        reasons.append(("uv", "registered: pipes connect over TCP first and move to ibv where both ends offer it"))
    else:
        reasons.append(("uv", "used: TCP"))
    reasons.append(("basic", "used: CPU buffers"))

    cuda_channels: tuple[str, ...] = ()
    gdr_nics: tuple[str, ...] | None = None
    if cuda:
        gdr = _gdr(
            why_not["cuda_gdr"],
            blocker,
            facts,
            hca,
            explicit="cuda_gdr" in required or (hca is not None and hca.explicit),
        )
        if gdr.usable and not fork_ok:
            gdr = _Gdr(False, None, fork_why)
        if not gdr.usable and "cuda_gdr" in required:
            raise ConfigError(
                f"{_setting(settings.channels)} requires cuda_gdr, but the rails cannot use it here: {gdr.why}"
            )
        if not gdr.usable and why_not["cuda_basic"] is not None:
            raise ConfigError(
                f"{_setting(settings.channels)} leaves CUDA buffers only cuda_gdr, which cannot be used here: {gdr.why}"
            )
        if gdr.usable:
            cuda_channels, gdr_nics = ("cuda_gdr",), gdr.nics
            reasons.append(("cuda_gdr", f"used: {gdr.why}"))
        else:
            reasons.append(("cuda_gdr", f"not used: {gdr.why}"))
        if why_not["cuda_basic"] is None:
            cuda_channels += ("cuda_basic",)
            fallback = ", the fallback to peers without cuda_gdr" if gdr.usable else ""
            reasons.append(("cuda_basic", f"used: staged through pinned host memory{fallback}"))
        else:
            reasons.append(("cuda_basic", f"not used: {why_not['cuda_basic']}"))
    else:
        reasons.append(("cuda", "no CUDA channel: this process's rails move no CUDA buffers"))
    reasons.append(("fork safety", fork_why))
    return RailsTransports(
        transports=("ibv", "uv") if ib_device is not None else ("uv",),
        cpu_channels=CPU_CHANNELS,
        cuda_channels=cuda_channels,
        gdr_nics=gdr_nics,
        ib_device=ib_device,
        required=required,
        reasons=tuple(reasons),
    )


def _allowed(settings: TransportSettings) -> tuple[dict[str, str | None], frozenset[str]]:
    """For every transport and channel: None if the settings allow it, else why not; and those required."""
    why_not_t, required_t = _verdicts(settings.transports, NETWORK_TRANSPORTS)
    why_not_c, required_c = _verdicts(settings.channels, CPU_CHANNELS + CUDA_CHANNELS)
    why_not = {**why_not_t, **why_not_c, "uv": None}  # uv: bootstrap and fallback, whatever the list says
    required = required_t | required_c
    if settings.ib_disable:
        for name, names in (("ibv", settings.transports), ("cuda_gdr", settings.channels)):
            if name in required and names is not None:
                raise ConfigError(f"{names.setting()} requires {name}, but {IB_DISABLE}=1 forbids InfiniBand")
            why_not[name] = f"{IB_DISABLE}=1"
    return why_not, required


def _verdicts(names: NameList | None, candidates: Sequence[str]) -> tuple[dict[str, str | None], frozenset[str]]:
    if names is None:
        return dict.fromkeys(candidates), frozenset()
    return names.verdicts(candidates)


def _setting(names: NameList | None) -> str:
    return names.setting() if names is not None else "the configuration"


def _check_hca(hca: HcaSelection, facts: HostFacts) -> str:
    selected = [d.name for d in facts.devices if hca.selects(d.name)]
    if not selected:
        raise ConfigError(
            f"{hca.setting()} selects no InfiniBand device of this machine; its devices: {facts.describe_devices()}"
        )
    return f"selects {', '.join(selected)} (port {TENSORPIPE_PORT})"


def _ib_blocker(facts: HostFacts) -> str | None:
    """Why no InfiniBand at all, whatever the device; None where devices can be opened."""
    if not facts.devices and not facts.unlisted:
        return f"no InfiniBand device ({facts.sysfs} is empty or missing)"
    if facts.verbs_error is not None:
        return facts.verbs_error
    if not facts.devices:
        return (
            f"libibverbs lists no device, though {facts.sysfs} has {', '.join(facts.unlisted)}: no userspace "
            "driver (rdma-core provider) for them"
        )
    return None


def _port_problem(device: IbDevice, roce_ok: bool) -> str | None:
    """Why `device` cannot carry TensorPipe's traffic; None where it can."""
    if device.efa:
        # EFA offers SRD queue pairs; TensorPipe's ibv and cuda_gdr create reliable-connected ones.
        return (
            f"{device.name} is an AWS EFA device, which has no reliable-connected queue pairs, and TensorPipe's "
            f"ibv needs them: set {IB_DISABLE}=1 (the rails on TCP), or use the NIXL rails over EFA "
            f"({RAILS_TRANSPORT}=nixl {NIXL_BACKEND}=LIBFABRIC)"
        )
    port = device.port(TENSORPIPE_PORT)
    if port is None:
        return f"{device.name} has no port {TENSORPIPE_PORT}"
    if not port.active:
        return f"{device.name} port {TENSORPIPE_PORT} is {port.state or 'in an unknown state'}, not ACTIVE"
    if port.roce and not roce_ok:
        # TensorPipe addresses RoCE peers by GID index 0 with hop limit 1: only
        # within one L2 segment, and not on fabrics that carry RoCE v2 only.
        return (
            f"{device.name} port {TENSORPIPE_PORT} is RoCE, where TensorPipe can only use GID index 0 with hop "
            f"limit 1; not chosen automatically: list it in {TRANSPORTS}/{CHANNELS} or select it in {IB_HCA}"
        )
    return None


def _ibv(
    why_not: str | None, blocker: str | None, facts: HostFacts, hca: HcaSelection | None, explicit: bool
) -> tuple[str | None, str]:
    """The device the ibv transport would open, or None; and why."""
    if why_not is not None:
        return None, why_not
    if blocker is not None:
        return None, blocker
    first = facts.devices[0]
    opens = f"TensorPipe's ibv transport opens only the first device libibverbs lists, {first.name}"
    if hca is not None and not hca.selects(first.name):
        return None, f"{opens}, which {hca.setting()} does not select"
    problem = _port_problem(first, explicit)
    if problem is not None:
        return None, f"{problem} ({opens}, port {TENSORPIPE_PORT})"
    port = first.port(TENSORPIPE_PORT)
    link = "RoCE" if port is not None and port.roce else "InfiniBand"
    return first.name, f"{first.name} port {TENSORPIPE_PORT} ({link}, ACTIVE), the first device libibverbs lists"


@dataclass(frozen=True)
class _Gdr:
    usable: bool
    # For cuda_gdr::create; None: TensorPipe's own choice.
    nics: tuple[str, ...] | None
    why: str


def _gdr(why_not: str | None, blocker: str | None, facts: HostFacts, hca: HcaSelection | None, explicit: bool) -> _Gdr:
    if why_not is not None:
        return _Gdr(False, None, why_not)
    if facts.num_gpus == 0:
        return _Gdr(False, None, "this process sees no CUDA device")
    if blocker is not None:
        return _Gdr(False, None, blocker)
    if facts.peer_memory is None:
        folder = f"/{PEER_MEMORY_FOLDER}"
        if facts.peer_memory_modules:
            why = (
                f"{', '.join(facts.peer_memory_modules)} is loaded but registered no peer-memory client in {folder} "
                "(it needs MLNX_OFED's peer-memory support), which TensorPipe's cuda_gdr requires"
            )
        else:
            why = f"no GPU peer-memory client in {folder}: GPUDirect RDMA needs nvidia_peermem loaded"
        return _Gdr(False, None, why)
    problems = {d.name: _port_problem(d, explicit) for d in facts.devices if hca is None or hca.selects(d.name)}
    usable = [d for d in facts.devices if d.name in problems and problems[d.name] is None]
    if not usable:
        return _Gdr(False, None, "no usable device: " + "; ".join(p for p in problems.values() if p))
    bar1 = " (TensorPipe also requires each GPU's BAR1 to cover its memory)"
    # TensorPipe's own choice spans every device listed, and needs their PCI paths.
    if hca is None and len(usable) == len(facts.devices) and all(d.pci_path for d in usable):
        names = ", ".join(d.name for d in usable)
        return _Gdr(True, None, f"TensorPipe maps each GPU to its PCI-nearest device of {names}{bar1}")
    nics, rule = map_gpus_to_nics(facts.gpus, usable)
    mapping = ", ".join(f"GPU {gpu} -> {nic}" for gpu, nic in enumerate(nics))
    return _Gdr(True, nics, f"{mapping} ({rule}){bar1}")


def map_gpus_to_nics(gpus: Sequence[str | None], nics: Sequence[IbDevice]) -> tuple[tuple[str, ...], str]:
    """Each GPU's device, and the rule used.

    Where every PCI path is known: the device sharing the most leading PCI path
    components with the GPU (TensorPipe's rule, by component rather than by
    character), ties going to the device with fewest GPUs so far, then to the
    earlier one. Otherwise round-robin: GPU i gets nics[i % len(nics)].
    """
    gpu_paths = [gpu for gpu in gpus if gpu is not None]
    nic_paths = [nic.pci_path for nic in nics if nic.pci_path is not None]
    if len(gpu_paths) < len(gpus) or len(nic_paths) < len(nics):
        return tuple(nics[i % len(nics)].name for i in range(len(gpus))), "round-robin: PCI paths unknown"
    load: Counter[str] = Counter()
    chosen = []
    for gpu in gpu_paths:
        shared = [_shared(PurePosixPath(gpu).parts, PurePosixPath(path).parts) for path in nic_paths]
        best = min(range(len(nics)), key=lambda i: (-shared[i], load[nics[i].name], i))
        load[nics[best].name] += 1
        chosen.append(nics[best].name)
    return tuple(chosen), "nearest by PCI path"


def _shared(a: Sequence[str], b: Sequence[str]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def needs_infiniband(settings: TransportSettings, cuda: bool) -> bool:
    """Whether the settings leave InfiniBand possible; where not, libibverbs is not even loaded."""
    why_not, _ = _allowed(settings)
    return why_not["ibv"] is None or (cuda and why_not["cuda_gdr"] is None)


# Probed once per process, per (InfiniBand possible, CUDA buffers).
_facts: dict[tuple[bool, bool], HostFacts] = {}


def rails_transports(settings: TransportSettings, cuda: bool | None = None) -> RailsTransports:
    """The decision for this process from its `settings` (Config.transport); `cuda`: whether its rails move
    CUDA buffers (default: a GPU is visible).

    libibverbs is loaded, and so initialised (fairring set the fork-safety
    variables at import), only where sysfs shows devices and the settings
    allow InfiniBand.
    """
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    return decide(settings, host_facts(needs_infiniband(settings, cuda), cuda), cuda)


def host_facts(verbs: bool, cuda: bool) -> HostFacts:
    """This host's facts, once per process; libibverbs is loaded only if `verbs`, GPUs read only if `cuda`."""
    key = (verbs, cuda)
    if key not in _facts:
        _facts[key] = probe_host(
            gpu_bus_ids=visible_gpu_bus_ids() if cuda else (), verbs=probe_verbs if verbs else None
        )
    return _facts[key]
