"""Which network interface each rank's rails use, chosen the way NCCL users expect.

`FAIRRING_SOCKET_IFNAME` takes `NCCL_SOCKET_IFNAME`'s grammar: a comma-separated
list of name prefixes (`eth,ens`); a leading `^` excludes the listed prefixes
instead (`^docker,lo`); a leading `=` makes them exact names (`=eth0`), and
`^=` excludes exact names. Unset, fairring falls back to `TP_SOCKET_IFNAME`
(exact names, as torch's RPC reads it), then to the job's own:
`GLOO_SOCKET_IFNAME` (exact names) and `NCCL_SOCKET_IFNAME`, NCCL's first
where the CUDA engine is on; with none it chooses as NCCL does: IPoIB
interfaces (`ib*`) first, then anything but `docker*`, `lo*` and `virbr*`,
then those, in that order.

One NIC per rail: when several interfaces match, rail i (the rank's local
index) takes the (i mod n)-th of them, in natural name order (eth2 before
eth10), or in the order written for an `=` list. So the L rails of a machine
leave through L NICs when it has them, and the same rail on every machine
uses the same-named NIC, which is what rail-optimised fabrics wire together.
`FAIRRING_RAIL_INTERFACES` overrides the mapping: `shared` puts every rail on
the first match, or a list of names gives rail i the (i mod n)-th name.

Only interfaces that are up, with an address of the chosen family
(`FAIRRING_SOCKET_FAMILY`; IPv4 before IPv6 otherwise) count; IPv6
link-local and loopback addresses never do (they need a scope or reach only
this host). A loopback interface is dropped from a match that also has others:
a rail on it could not reach another machine.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ._errors import ConfigError
from ._nccl_lists import names_match, split_list

SOCKET_IFNAME = "FAIRRING_SOCKET_IFNAME"
TP_SOCKET_IFNAME = "TP_SOCKET_IFNAME"
# What an NCCL job already sets: the rails follow it where fairring's own variables are unset.
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
# What a Gloo (CPU) job sets: exact names, comma-separated; first where the CUDA engine is off.
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
SOCKET_FAMILY = "FAIRRING_SOCKET_FAMILY"
RAIL_INTERFACES = "FAIRRING_RAIL_INTERFACES"

# Linux's IFNAMSIZ (16) less the terminating NUL.
_MAX_IFNAME = 15


@dataclass(frozen=True)
class InterfaceAddress:
    """One address of one interface, as `_C.interface_addresses()` lists it."""

    name: str
    family: str  # "ipv4" or "ipv6"
    address: str
    up: bool = True
    loopback: bool = False
    link_local: bool = False

    def __str__(self) -> str:
        state = "" if self.up else ", down"
        return f"{self.name} ({self.address}{state})"


@dataclass(frozen=True)
class InterfaceFilter:
    """A parsed NCCL_SOCKET_IFNAME-style list: which interface names it admits."""

    names: tuple[str, ...]
    exclude: bool = False
    exact: bool = False

    def matches(self, name: str) -> bool:
        listed = any(names_match(name, n, self.exact) for n in self.names)
        return listed != self.exclude

    def __str__(self) -> str:
        return ("^" if self.exclude else "") + ("=" if self.exact else "") + ",".join(self.names)


@dataclass(frozen=True)
class RailInterface:
    """The interface and address one rank's rails listen on, and why."""

    name: str
    address: str
    reason: str


def parse_interface_filter(variable: str, raw: str, exact: bool = False) -> InterfaceFilter:
    """The list in `raw` (the value of `variable`); `exact` reads bare names as exact ones."""
    exclude, written_exact, entries = split_list(raw)
    exact = exact or written_exact
    names = tuple(name for name in entries if name)
    if not names:
        raise ConfigError(
            f"{variable}={raw!r} names no interface; give comma-separated name prefixes (eth,ens), "
            "'^' first to exclude them (^docker,lo), or '=' first for exact names (=eth0)"
        )
    for name in names:
        if len(name) > _MAX_IFNAME or re.search(r"[\s/^=]", name):
            raise ConfigError(
                f"{variable}={raw!r}: {name!r} cannot be an interface name (at most {_MAX_IFNAME} "
                "characters, no spaces, '/', and '^' or '=' only at the start of the list)"
            )
    return InterfaceFilter(names, exclude=exclude, exact=exact)


def parse_family(raw: str | None) -> str | None:
    """FAIRRING_SOCKET_FAMILY: 'ipv4', 'ipv6' or None (both, IPv4 first)."""
    if raw is None or raw.strip() == "":
        return None
    families = {"af_inet": "ipv4", "ipv4": "ipv4", "4": "ipv4", "af_inet6": "ipv6", "ipv6": "ipv6", "6": "ipv6"}
    family = families.get(raw.strip().lower())
    if family is None:
        raise ConfigError(f"{SOCKET_FAMILY}={raw!r} is not an address family; use AF_INET (IPv4) or AF_INET6 (IPv6)")
    return family


def parse_rail_interfaces(raw: str | None) -> str | tuple[str, ...]:
    """FAIRRING_RAIL_INTERFACES: 'spread' (default), 'shared', or exact names by rail."""
    if raw is None or raw.strip() == "" or raw.strip().lower() == "spread":
        return "spread"
    if raw.strip().lower() == "shared":
        return "shared"
    listed = parse_interface_filter(RAIL_INTERFACES, raw, exact=True)
    if listed.exclude:
        raise ConfigError(
            f"{RAIL_INTERFACES}={raw!r}: list the interface of each rail in order; '^' has no meaning here"
        )
    return listed.names


def host_addresses() -> list[InterfaceAddress]:
    """This host's interface addresses, in getifaddrs() order."""
    from . import _C

    return [InterfaceAddress(**entry) for entry in _C.interface_addresses()]


def _natural_key(name: str) -> list[object]:
    # eth2 before eth10: digits compare as numbers.
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def usable_addresses(addresses: Sequence[InterfaceAddress], family: str | None) -> dict[str, InterfaceAddress]:
    """The address each usable interface would listen on, by interface name.

    An interface counts if it is up and has an address of `family` (any, IPv4
    first, when None) that is neither IPv6 link-local nor IPv6 loopback.
    """
    chosen: dict[str, InterfaceAddress] = {}
    for address in addresses:
        if not address.up or address.link_local or (family is not None and address.family != family):
            continue
        if address.family == "ipv6" and address.loopback:
            continue
        current = chosen.get(address.name)
        if current is None or (current.family == "ipv6" and address.family == "ipv4"):
            chosen[address.name] = address
    return chosen


# NCCL's automatic order: IPoIB, then anything but containers' and the host's
# own interfaces, then those.
AUTOMATIC_ORDER = (
    InterfaceFilter(("ib",)),
    InterfaceFilter(("docker", "lo", "virbr"), exclude=True),
    InterfaceFilter(("docker",)),
    InterfaceFilter(("lo",)),
    InterfaceFilter(("virbr",)),
)


def matching_interfaces(
    addresses: Sequence[InterfaceAddress],
    interface_filter: InterfaceFilter | None,
    family: str | None,
    variable: str = SOCKET_IFNAME,
) -> tuple[list[InterfaceAddress], str]:
    """The interfaces the rails may use, in rail order, and how they were chosen.

    ConfigError, listing this host's interfaces, if none matches.
    """
    usable = usable_addresses(addresses, family)
    if interface_filter is None:
        for automatic in AUTOMATIC_ORDER:
            matched = [usable[name] for name in sorted(usable, key=_natural_key) if automatic.matches(name)]
            if matched:
                return matched, f"{SOCKET_IFNAME} unset, so NCCL's automatic order: '{automatic}'"
        raise ConfigError(
            f"fairring: no network interface can carry the rails: {describe_host(addresses, family)}. "
            f"Bring one up with an address, or name one in {SOCKET_IFNAME}"
        )
    if interface_filter.exact and not interface_filter.exclude:
        names = list(dict.fromkeys(n for n in interface_filter.names if n in usable))
    else:
        names = sorted((n for n in usable if interface_filter.matches(n)), key=_natural_key)
    matched = [usable[name] for name in names]
    if any(not a.loopback for a in matched):
        matched = [a for a in matched if not a.loopback]
    if not matched:
        raise ConfigError(
            f"{variable} '{interface_filter}' matches no usable network interface; {describe_host(addresses, family)}"
        )
    return matched, f"{variable} '{interface_filter}'"


def describe_host(addresses: Sequence[InterfaceAddress], family: str | None) -> str:
    """'this host has: eth0 (10.0.0.1), lo (127.0.0.1)', for errors."""
    seen: dict[str, list[str]] = {}
    for address in addresses:
        notes = seen.setdefault(address.name, [])
        note = address.address
        if address.link_local:
            note += " link-local"
        if not address.up:
            note += " down"
        notes.append(note)
    listed = ", ".join(f"{name} ({'; '.join(notes)})" for name, notes in seen.items()) or "no interface"
    only = f" (only {'IPv4' if family == 'ipv4' else 'IPv6'} addresses count: {SOCKET_FAMILY})" if family else ""
    return f"this host has: {listed}{only}"


class InterfaceSettings(Protocol):
    """The settings the choice reads (fairring._config.Config parses them)."""

    @property
    def socket_ifname(self) -> InterfaceFilter | None: ...
    @property
    def socket_family(self) -> str | None: ...
    @property
    def socket_ifname_variable(self) -> str: ...
    @property
    def rail_interfaces(self) -> str | tuple[str, ...]: ...


def choose_rail_interface(
    config: InterfaceSettings, local_rank: int, addresses: Sequence[InterfaceAddress] | None = None
) -> RailInterface:
    """The interface rail `local_rank` of this machine listens on (see the module's docstring)."""
    addresses = host_addresses() if addresses is None else addresses
    matched, how = matching_interfaces(
        addresses, config.socket_ifname, config.socket_family, config.socket_ifname_variable
    )
    mapping = config.rail_interfaces
    if mapping == "shared":
        chosen, rule = matched[0], f"{RAIL_INTERFACES}=shared: every rail on the first"
    elif mapping == "spread":
        chosen = matched[local_rank % len(matched)]
        rule = f"rail {local_rank} takes match {local_rank % len(matched)} of {len(matched)}"
    else:
        by_name = {a.name: a for a in matched}
        missing = [name for name in mapping if name not in by_name]
        if missing:
            raise ConfigError(
                f"{RAIL_INTERFACES}={','.join(mapping)} names {', '.join(missing)}, which "
                f"{'is' if len(missing) == 1 else 'are'} not among the interfaces the rails may use "
                f"({', '.join(by_name)}, by {how}); {describe_host(addresses, config.socket_family)}"
            )
        chosen = by_name[mapping[local_rank % len(mapping)]]
        rule = f"{RAIL_INTERFACES}: rail {local_rank} takes entry {local_rank % len(mapping)}"
    names = ", ".join(a.name for a in matched)
    return RailInterface(chosen.name, chosen.address, f"{how} matches {names}; {rule}")


SYSFS_NET = Path("/sys/class/net")


def nic_speed_mbps(interface: str, sysfs: Path = SYSFS_NET) -> int | None:
    """The link speed the kernel reports for `interface` in Mbit/s; None where it reports none
    (loopback, most virtual NICs: the file is unreadable or holds -1)."""
    try:
        speed = int((sysfs / interface / "speed").read_text().strip())
    except (OSError, ValueError):
        return None
    return speed if speed > 0 else None
