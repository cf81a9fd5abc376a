"""What each rank's rails use, the NICs' rate, and the hierarchical bound it sets."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import fairring
from fairring._interfaces import SYSFS_NET, nic_speed_mbps
from fairring.bench.collectives import COLLECTIVES

# Fields that differ between ranks of one setup; ranks are grouped on the rest.
PER_RANK = ("rank", "host", "address", "machine", "nic_mbps", "rails")


def network_fields(group: dist.ProcessGroup, device: torch.device) -> dict[str, Any]:
    """The fairring group's rails network as its backend holds it (config.network)."""
    network = fairring.backend_of(group, device).config.network
    cuda_channels = list(network.cuda_channels)
    nixl = network.transport == "nixl"
    return {
        "address": network.listen_address,
        "interface": network.interface_name,
        "transport": network.transport,
        "tensorpipe_transports": list(network.transports),
        "cpu_channels": list(network.cpu_channels),
        "cuda_channels": cuda_channels,
        # TensorPipe's GPUDirect RDMA channel, or NICs that NIXL may reach GPU memory through.
        "gpu_direct_rdma": "cuda_gdr" in cuda_channels or bool(network.gpu_direct_nics),
        "gpu_direct_nics": list(network.gpu_direct_nics),
        "nixl_backend": network.nixl_backend if nixl else None,
        # fairring exports its UCX choices when NIXL's engine is made; the user's own are kept.
        "ucx": {name: value for name, value in sorted(os.environ.items()) if name.startswith("UCX_")} if nixl else {},
    }


def describe_rank(group: dist.ProcessGroup, device: torch.device, before: dict[str, Any]) -> dict[str, Any]:
    """This rank's rails after the sweep, with where and when their network was chosen."""
    backend = fairring.backend_of(group, device)
    fields = network_fields(group, device)
    return {
        "rank": dist.get_rank(),
        "host": platform.node(),
        "machine": backend.topology.machine,
        **fields,
        "nic_mbps": nic_speed_mbps(fields["interface"]),
        # Whether the first engine all-reduce changed config.network: the network may be chosen then.
        "chosen_by_first_all_reduce": before != fields,
        "rails": (backend.rails(device.type) or {}).get("description"),  # what the mesh says, per rank
    }


def grouped(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ranks with identical rails settings, one entry per setting, in rank order."""
    groups: dict[str, dict[str, Any]] = {}
    for described in sorted(ranks, key=lambda item: item["rank"]):
        shared = {key: value for key, value in described.items() if key not in PER_RANK}
        entry = groups.setdefault(repr(sorted(shared.items())), {**shared, "ranks": [], "hosts": []})
        entry["ranks"].append(described["rank"])
        if described["host"] not in entry["hosts"]:
            entry["hosts"].append(described["host"])
    return list(groups.values())


@dataclass(frozen=True)
class Bound:
    """Each machine's NIC rate (bytes per second, all its rails' NICs together) and where it came from."""

    bytes_per_s: float | None
    source: str  # "--nic-gbps", "sysfs", or "unknown"
    why_unknown: str
    machines: list[dict[str, Any]]

    def seconds(self, nbytes: int, num_machines: int, collective: str = "all_reduce") -> float | None:
        """2(M-1)/M x S (an all-reduce) or (M-1)/M x S over the slowest machine's NICs: none can be faster."""
        if self.bytes_per_s is None:
            return None
        return COLLECTIVES[collective].bound_s(nbytes, num_machines, self.bytes_per_s)


def machine_rates(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per machine, the sum of its distinct NICs' speeds (None if any is unknown)."""
    machines: dict[int, dict[str, Any]] = {}
    for described in ranks:
        machine = machines.setdefault(described["machine"], {"machine": described["machine"], "nics": {}})
        machine["nics"][f"{described['host']}:{described['interface']}"] = described["nic_mbps"]
    for machine in machines.values():
        speeds = list(machine["nics"].values())
        machine["bytes_per_s"] = None if None in speeds else sum(speeds) * 1e6 / 8
    return [machines[key] for key in sorted(machines)]


def nic_bound(ranks: list[dict[str, Any]], nic_gbps: float | None) -> Bound:
    """The rate that bounds the all-reduce: --nic-gbps, else the slowest machine's NICs from sysfs."""
    machines = machine_rates(ranks)
    if nic_gbps is not None:
        return Bound(nic_gbps * 1e9 / 8, "--nic-gbps", "", machines)
    # Emulated machines on one host share its NICs: name each once.
    unknown = list(
        dict.fromkeys(nic for machine in machines for nic, speed in machine["nics"].items() if speed is None)
    )
    if unknown:
        why = (
            f"the kernel reports no speed for {', '.join(unknown[:4])}{' ...' if len(unknown) > 4 else ''} "
            f"({SYSFS_NET}/<interface>/speed): give each machine's NIC rate with --nic-gbps"
        )
        return Bound(None, "unknown", why, machines)
    return Bound(min(machine["bytes_per_s"] for machine in machines), "sysfs", "", machines)
