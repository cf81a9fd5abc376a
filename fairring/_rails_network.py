"""How a rank's rails reach their peers: the interface, transports and channels, logged once.

The choices are made at init (fairring/_interfaces.py, fairring/_transports.py),
where a bad setting fails every rank of the group with a message that says
what to change, rather than inside TensorPipe when the first all-reduce
builds the rails.
"""

from __future__ import annotations

import logging

import torch

from . import _C
from ._config import Config
from ._interfaces import InterfaceAddress, RailInterface, choose_rail_interface, host_addresses
from ._nixl import choose_ucx_settings, nixl_library
from ._transports import RailsTransports, host_facts, rails_transports

logger = logging.getLogger("fairring")
_logged: set[str] = set()

# The NIXL rails register no TensorPipe transport or channel: UCX or libfabric choose theirs.
NIXL_RAILS = RailsTransports((), (), (), None, None, frozenset(), ())


def nixl_settings(config: Config, interface: str, topology: _C.Topology, cuda: bool) -> str:
    """Sets the NIXL backend's device variables for this rail where the user did not; what it will use."""
    if config.nixl_backend == "LIBFABRIC":
        return "libfabric: NIXL maps each GPU to its nearest EFA devices (hwloc); FI_PROVIDER picks the provider"
    gpu = torch.cuda.current_device() if cuda else None
    facts = host_facts(verbs=False, cuda=cuda)
    return choose_ucx_settings(interface, config.transport, facts, topology.local_rank, gpu)


def keeps_for_resend(config: Config, topology: _C.Topology) -> bool:
    """Whether the rails keep every message until acknowledged: the same on every rank, spares or not.

    The TensorPipe rails' only (config refuses failover on the NIXL rails), on CPU and CUDA engines alike, and only
    where a machine has other rails to switch to.
    """
    return (
        config.rail_failover
        and config.rails_transport == "tensorpipe"
        and topology.serves_engine
        and topology.local_size > 1
    )


def spare_interfaces(
    config: Config, interface: str, addresses: list[InterfaceAddress], topology: _C.Topology
) -> list[InterfaceAddress]:
    """The machine's other rails' interfaces, from the next rail on: where a rail switch may move this rank's rails.

    The same rail on every machine takes the same spare, so on rail-optimised fabrics the spares reach each other.
    """
    if not keeps_for_resend(config, topology):
        return []
    size = topology.local_size
    spares: dict[str, InterfaceAddress] = {}
    for step in range(1, size):
        chosen = choose_rail_interface(config, (topology.local_rank + step) % size, addresses)
        if chosen.name != interface and chosen.name not in spares:
            spares[chosen.name] = InterfaceAddress(chosen.name, "", chosen.address)
    return list(spares.values())


def rails_line(rank: int, machine: int, machines: int, rail: int, interface: RailInterface, carried: str) -> str:
    """What a rank says of its rails at INFO: where they listen, why there, and what carries them."""
    return (
        f"rank {rank} (machine {machine} of {machines}, rail {rail}): rails on {interface.name} "
        f"{interface.address} ({interface.reason}); {carried}"
    )


def rails_network(config: Config, topology: _C.Topology) -> _C.RailsNetwork:
    """The rails' network for this rank of `topology`, logged at INFO the first time it is chosen."""
    addresses = host_addresses()
    interface = choose_rail_interface(config, topology.local_rank, addresses)
    # The rails move CUDA buffers only for the CUDA engine; otherwise NCCL takes CUDA tensors.
    cuda = config.cuda_engine_in_use and torch.cuda.is_available()
    library = ""
    if config.rails_transport == "nixl":
        transports = NIXL_RAILS
        library = nixl_library()
        devices = nixl_settings(config, interface.name, topology, cuda)
        carried = f"NIXL {config.nixl_backend} ({library}); {devices}"
    else:
        transports = rails_transports(config.transport, cuda=cuda)
        carried = transports.describe()
    spares = spare_interfaces(config, interface.name, addresses, topology)
    if spares:
        carried += f"; failover to {', '.join(f'{s.name} {s.address}' for s in spares)}"
    if topology.serves_engine:
        where = (topology.rank, topology.machine, topology.num_machines, topology.local_rank)
        line = rails_line(*where, interface, carried)
        # Every group of a process chooses alike: say it once, not once per group.
        logger.log(logging.DEBUG if line in _logged else logging.INFO, line)
        _logged.add(line)
    return _C.RailsNetwork(
        listen_address=interface.address,
        interface_name=interface.name,
        spare_interfaces=[spare.name for spare in spares],
        spare_addresses=[spare.address for spare in spares],
        rail_failover=keeps_for_resend(config, topology),
        transports=list(transports.transports),
        cpu_channels=list(transports.cpu_channels),
        cuda_channels=list(transports.cuda_channels),
        gpu_direct_nics=list(transports.gdr_nics or ()),
        required=sorted(transports.required),
        transport=config.rails_transport,
        nixl_backend=config.nixl_backend,
        nixl_library=library,
        secret=config.rails_secret or "",
        encrypt=config.rails_encrypt,
    )
