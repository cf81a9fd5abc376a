"""What this host offers the rails for InfiniBand: devices, libibverbs, peer memory, fork safety.

Discovery only: fairring._transports decides what the rails use. Every reader
takes a root folder, so tests build fake sysfs trees, and libibverbs is asked
only through a replaceable probe. This module imports nothing but the standard
library: fairring/__init__ imports it before anything else (see IMPORT_STATE).
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# rdma-core (libibverbs/init.c, ibverbs_init) calls ibv_fork_init() when either
# variable *exists*, whatever its value, and reads them once: at the process's
# first ibv_get_device_list. RDMAV_FORK_SAFE=0 therefore does not turn it off.
FORK_SAFE_VARIABLES = ("RDMAV_FORK_SAFE", "IBV_FORK_SAFE")
# The library TensorPipe dlopens (tensorpipe/common/ibv_lib.h, IbvLib::create).
LIBIBVERBS = "libibverbs.so.1"
SYSFS_INFINIBAND = "sys/class/infiniband"
# Where a GPU peer-memory client registers: TensorPipe's cuda_gdr is viable only
# if one of these exists (channel/cuda_gdr/context_impl.cc, isNvidiaPeerMemoryClientActive).
PEER_MEMORY_CLIENTS = ("nvidia-peermem", "nv_mem")
PEER_MEMORY_FOLDER = "sys/kernel/mm/memory_peers"
# The kernel modules that provide them (named in messages only).
PEER_MEMORY_MODULES = ("nvidia_peermem", "nv_peer_mem")
# ibv_is_fork_initialized() (rdma-core >= v35): enum ibv_fork_status.
FORK_STATUSES = {0: "disabled", 1: "enabled", 2: "unneeded"}


@dataclass(frozen=True)
class IbPort:
    """One port of an RDMA device, as sysfs shows it."""

    number: int
    state: str = ""  # ACTIVE, DOWN, INIT, ARMED, ACTIVE_DEFER; "" if unreadable
    link_layer: str = ""  # InfiniBand, or Ethernet (RoCE); "" if unreadable

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"

    def describe(self) -> str:
        link = "RoCE" if self.roce else (self.link_layer or "link layer unknown")
        return f"port {self.number} {self.state or 'state unknown'} {link}"


@dataclass(frozen=True)
class IbDevice:
    """An RDMA device (HCA): its ports and where it sits in the PCI tree."""

    name: str
    ports: tuple[IbPort, ...] = ()
    # Canonical sysfs path (/sys/devices/pci.../...); None for virtual devices.
    pci_path: str | None = None

    def port(self, number: int) -> IbPort | None:
        return next((port for port in self.ports if port.number == number), None)

    @property
    def efa(self) -> bool:
        """An AWS Elastic Fabric Adapter: libibverbs lists it as efa_N, its ports' link layer Unspecified."""
        return self.name.startswith("efa") or any(port.link_layer.lower() == "unspecified" for port in self.ports)

    def describe(self) -> str:
        ports = ", ".join(port.describe() for port in self.ports) or "no ports"
        return f"{self.name} ({ports})"


@dataclass(frozen=True)
class ImportState:
    """The fork-safety variables when fairring was imported, before it set the missing ones."""

    # The values the user had set (fairring sets the others to 1).
    user_values: tuple[tuple[str, str], ...] = ()
    # libibverbs was already mapped into the process.
    ibverbs_loaded: bool = False


@dataclass(frozen=True)
class ForkFacts:
    """What decides whether fork() is safe once the rails use InfiniBand."""

    # The variables in the environment now.
    present: tuple[str, ...] = FORK_SAFE_VARIABLES
    # The values the user set before importing fairring.
    user_values: tuple[tuple[str, str], ...] = ()
    # libibverbs was in the process before fairring set the variables, which the
    # user had not set: it may have initialised without them.
    preloaded: bool = False
    # ibv_is_fork_initialized() once libibverbs initialised: "enabled",
    # "unneeded" (the kernel copies pinned pages on fork), "disabled"; None: unknown.
    status: str | None = None


@dataclass(frozen=True)
class VerbsProbe:
    """What libibverbs reports: its devices in ibv_get_device_list order, or why it cannot."""

    names: tuple[str, ...] = ()
    error: str | None = None
    fork_status: str | None = None


@dataclass(frozen=True)
class HostFacts:
    """Everything the rails' transport decision depends on, about this host and process."""

    # In ibv_get_device_list order, which TensorPipe uses (its ibv transport opens
    # the first); sysfs order (sorted) where libibverbs could not list them.
    devices: tuple[IbDevice, ...] = ()
    # In sysfs but not listed by libibverbs: no userspace driver (rdma-core provider).
    unlisted: tuple[str, ...] = ()
    # Why libibverbs cannot be used; None where it can, or was not needed.
    verbs_error: str | None = None
    # The registered GPU peer-memory client (cuda_gdr needs one), and the modules loaded.
    peer_memory: str | None = None
    peer_memory_modules: tuple[str, ...] = ()
    # One entry per GPU this process sees (CUDA's order): its PCI path, None if unknown.
    gpus: tuple[str | None, ...] = ()
    fork: ForkFacts = field(default_factory=ForkFacts)
    sysfs: str = "/" + SYSFS_INFINIBAND

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    def describe_devices(self) -> str:
        if not self.devices and not self.unlisted:
            return f"none ({self.sysfs} is empty or missing)"
        listed = [device.describe() for device in self.devices]
        listed += [f"{name} (no userspace driver)" for name in self.unlisted]
        return "; ".join(listed)


def ibverbs_mapped(maps: str) -> bool:
    """Whether /proc/<pid>/maps text shows libibverbs mapped into the process."""
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and os.path.basename(fields[5]).startswith("libibverbs.so"):
            return True
    return False


def read_import_state(environ: Mapping[str, str] | None = None, maps_path: str = "/proc/self/maps") -> ImportState:
    environ = os.environ if environ is None else environ
    try:
        maps = Path(maps_path).read_text()
    except OSError:
        maps = ""  # not Linux's procfs: nothing to learn
    user_values = tuple((name, environ[name]) for name in FORK_SAFE_VARIABLES if name in environ)
    return ImportState(user_values=user_values, ibverbs_loaded=ibverbs_mapped(maps))


# Taken when fairring/__init__ imports this module, which it does before it sets
# the variables: whatever loaded libibverbs earlier did so without fairring's help.
IMPORT_STATE = read_import_state()


def fork_safety_set_by_fairring(import_state: ImportState | None = None) -> tuple[str, ...]:
    """The fork-safety variables fairring/__init__ set because the user had not."""
    state = IMPORT_STATE if import_state is None else import_state
    user = {name for name, _ in state.user_values}
    return tuple(name for name in FORK_SAFE_VARIABLES if name not in user)


def fork_facts(import_state: ImportState, environ: Mapping[str, str], status: str | None) -> ForkFacts:
    return ForkFacts(
        present=tuple(name for name in FORK_SAFE_VARIABLES if name in environ),
        user_values=import_state.user_values,
        # The user's own variables were there before anything could load libibverbs
        # (exported before Python started, as a rule), so only fairring's count.
        preloaded=import_state.ibverbs_loaded and not import_state.user_values,
        status=status,
    )


def probe_verbs(library: str = LIBIBVERBS) -> VerbsProbe:
    """Loads libibverbs and lists its devices, which also initialises it.

    Call only once the fork-safety variables are set: initialising reads them.
    Listing opens no device and registers no memory.
    """
    try:
        verbs = ctypes.CDLL(library, use_errno=True)
    except OSError as error:
        return VerbsProbe(error=f"{library} cannot be loaded ({error})")
    verbs.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
    verbs.ibv_get_device_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
    verbs.ibv_get_device_name.restype = ctypes.c_char_p
    verbs.ibv_get_device_name.argtypes = [ctypes.c_void_p]
    verbs.ibv_free_device_list.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    count = ctypes.c_int(0)
    ctypes.set_errno(0)
    devices = verbs.ibv_get_device_list(ctypes.byref(count))
    if not devices:
        # Old libibverbs set errno to -ENOSYS (TensorPipe's IbvDeviceList::create flips it too).
        code = abs(ctypes.get_errno())
        if code == errno.ENOSYS:
            error = "the kernel's InfiniBand (uverbs) modules are not loaded (ibv_get_device_list: ENOSYS)"
        else:
            error = f"ibv_get_device_list failed ({os.strerror(code) if code else 'no error code'})"
        return VerbsProbe(error=error, fork_status=_fork_status(verbs))
    try:
        names = tuple((verbs.ibv_get_device_name(devices[i]) or b"?").decode() for i in range(count.value))
    finally:
        verbs.ibv_free_device_list(devices)
    return VerbsProbe(names=names, fork_status=_fork_status(verbs))


def _fork_status(verbs: ctypes.CDLL) -> str | None:
    query = getattr(verbs, "ibv_is_fork_initialized", None)  # rdma-core v35 and later
    if query is None:
        return None
    query.restype = ctypes.c_int
    query.argtypes = []
    return FORK_STATUSES.get(query())


def probe_host(
    root: str | os.PathLike[str] = "/",
    gpu_bus_ids: Sequence[str] = (),
    verbs: Callable[[], VerbsProbe] | None = probe_verbs,
    import_state: ImportState | None = None,
    environ: Mapping[str, str] | None = None,
) -> HostFacts:
    """The facts of this host under `root` (a fake sysfs tree in tests).

    `gpu_bus_ids`: the PCI addresses of the visible GPUs, in CUDA's order.
    `verbs` is asked only where sysfs shows devices; None: do not load
    libibverbs (the rails will not use InfiniBand anyway).
    """
    root = Path(root)
    folder = root / SYSFS_INFINIBAND
    in_sysfs = sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []
    probe = verbs() if in_sysfs and verbs is not None else None
    if probe is not None and probe.error is None:
        order = list(probe.names)
        unlisted = tuple(name for name in in_sysfs if name not in probe.names)
    else:
        order, unlisted = in_sysfs, ()
    verbs_error = probe.error if probe is not None else None
    if in_sysfs and probe is None:
        verbs_error = f"{LIBIBVERBS} was not probed"
    peers = root / PEER_MEMORY_FOLDER
    return HostFacts(
        devices=tuple(read_device(folder, name) for name in order),
        unlisted=unlisted,
        verbs_error=verbs_error,
        peer_memory=next((c for c in PEER_MEMORY_CLIENTS if (peers / c / "version").exists()), None),
        peer_memory_modules=tuple(m for m in PEER_MEMORY_MODULES if (root / "sys/module" / m).is_dir()),
        gpus=tuple(_canonical(root / "sys/bus/pci/devices" / bus_id.lower()) for bus_id in gpu_bus_ids),
        fork=fork_facts(
            IMPORT_STATE if import_state is None else import_state,
            os.environ if environ is None else environ,
            probe.fork_status if probe is not None else None,
        ),
        sysfs=str(Path("/") / SYSFS_INFINIBAND) if root == Path("/") else str(folder),
    )


def read_device(folder: Path, name: str) -> IbDevice:
    """Device `name` under `folder` (/sys/class/infiniband): ports and PCI path."""
    ports = []
    port_folder = folder / name / "ports"
    if port_folder.is_dir():
        for entry in sorted(port_folder.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
            if entry.name.isdigit():
                # "4: ACTIVE" -> ACTIVE
                state = _read(entry / "state").rpartition(":")[2].strip()
                ports.append(IbPort(int(entry.name), state, _read(entry / "link_layer")))
    return IbDevice(name=name, ports=tuple(ports), pci_path=_canonical(folder / name / "device"))


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _canonical(path: Path) -> str | None:
    return os.path.realpath(path) if path.exists() else None


def visible_gpu_bus_ids() -> tuple[str, ...]:
    """PCI addresses of the GPUs this process sees, as sysfs names them (0000:3b:00.0)."""
    import torch

    if not torch.cuda.is_available():
        return ()
    addresses = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        try:
            # GPUs are function 0 of their PCI device.
            addresses.append(f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0")
        except AttributeError:
            addresses.append("unknown")  # no such sysfs entry: its path stays unknown
    return tuple(addresses)
