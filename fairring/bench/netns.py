"""Emulate several separate hosts on one machine with Linux network namespaces.

Ranks that all run on one machine talk over loopback, which hides everything a
real cluster has: a NIC with finite bandwidth, per-host traffic that can be
counted, and the fact that 127.0.0.1 on one host is not 127.0.0.1 on another. A
network namespace is a real, separate network stack, so a `NetnsCluster` gives
each emulated host its own interfaces, addresses, routing and loopback:

    bridge fb<tag>, in the root namespace
     ├── fv<tag>-0 ═══ veth pair ═══ eth0 10.x.y.1/24 (and lo), in namespace fairring-<tag>-0
     ├── fv<tag>-1 ═══ veth pair ═══ eth0 10.x.y.2/24 (and lo), in namespace fairring-<tag>-1
     └── ...

where <tag> is the creating process's pid and a per-process serial, in hex, so that clusters of
different processes, or of one, never collide, and leftovers name the process that made them.

Each host's `eth0` is one end of a veth pair whose other end is attached to a
bridge private to the cluster, so hosts reach each other by address exactly as
over a switch, and `eth0`'s statistics count only that host's traffic. With a
`rate`, a tbf qdisc shapes both directions of every host's "NIC": egress on
`eth0` inside the namespace (what the host sends), and egress of the outer veth
end into the namespace (what the host receives), since a qdisc only ever shapes
the egress of its device.

Processes join a host with `exec_argv` (for `ip netns exec`) or, in a freshly
spawned Python worker, with `enter_namespace`.

Names: `ip netns exec NAME` bind-mounts `/etc/netns/NAME/hosts` over /etc/hosts,
so the cluster writes one for each host, naming every host's address (and the
machine's hostname as the host's own address, as on a real host). Without it, a
namespace, which reaches no DNS server, fails to look up its peers' addresses
(c10d warns that "the hostname of the client socket cannot be retrieved") and
resolves the machine's hostname to a loopback that other hosts cannot reach.
`enter_namespace` mounts only the namespace's sysfs: processes that join that
way see the machine's /etc/hosts.

Cleanup: namespaces, veths, bridges and those hosts files are machine-wide
state that outlives the process, so `NetnsCluster` removes them when the `with`
block is left, however it is left, and also from an atexit handler if the
process exits with the cluster still open (nothing can run on SIGKILL; the names
then carry the pid of the process that made them). `close()` is idempotent and
tries every step even when one fails; a cleanup failure never replaces an
exception raised by the body.
"""

from __future__ import annotations

import atexit
import ctypes
import ipaddress
import itertools
import os
import shutil
import socket
import subprocess
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from errno import ENOTEMPTY
from functools import cache
from types import TracebackType

from fairring._sizes import parse_rate

__all__ = [
    "CommandError",
    "Host",
    "NetnsCluster",
    "check_mtu",
    "enter_namespace",
    "netns_available",
]

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_SLAVE = 0x80000
MNT_DETACH = 0x2
NETNS_DIR = "/var/run/netns"
# Where `ip netns exec NAME` looks for files to bind-mount over /etc (iproute2's NETNS_ETC_DIR).
NETNS_ETC_DIR = "/etc/netns"
INTERFACE = "eth0"
# Linux's IFNAMSIZ is 16 including the terminating NUL.
MAX_IFNAME = 15
# 10.0.0.0/8 holds 65536 /24s; the cluster takes the first one nothing on the machine uses.
PRIVATE_RANGE = ipaddress.IPv4Network("10.0.0.0/8")
PREFIX_LEN = 24
# The smallest tbf bucket: it must hold at least one full GSO/TSO packet (64 KiB), or tbf has to split them.
MIN_BURST_BYTES = 64 * 1024
TBF_LATENCY = "50ms"
# IPv4's minimum; jumbo frames (9000) fit well below the tbf bucket, which holds one 64 KiB GSO packet.
MIN_MTU = 576
MAX_MTU = 9000

_cluster_ids = itertools.count()


@dataclass(frozen=True)
class Host:
    """One emulated host: the network namespace `name`, reachable at `address` on `interface`."""

    name: str
    address: str
    interface: str = INTERFACE
    # With several networks: the host's interface on each (eth0, eth1, ...) and its address there.
    interfaces: tuple[str, ...] = (INTERFACE,)
    addresses: tuple[str, ...] = ()


class CommandError(subprocess.CalledProcessError):
    """A failed command; unlike CalledProcessError's, its message includes the stderr where ip and tc say why."""

    def __str__(self) -> str:
        return f"{super().__str__()}: {(self.stderr or '').strip()}"


def _tool_env() -> dict[str, str]:
    """This process's environment for ip and tc, less LD_PRELOAD: a sanitized test run preloads
    ASan, which has no business in iproute2 (and reports its own overlapping strncpy)."""
    return {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, check=True, capture_output=True, text=True, env=_tool_env()).stdout
    except subprocess.CalledProcessError as error:
        raise CommandError(error.returncode, error.cmd, error.output, error.stderr) from None


def check_mtu(mtu: int) -> None:
    """ValueError unless `mtu` is one an emulated NIC may have."""
    if not MIN_MTU <= mtu <= MAX_MTU:
        raise ValueError(f"an emulated NIC's MTU is {MIN_MTU} to {MAX_MTU} bytes, not {mtu}")


def _tbf_args(rate: str) -> list[str]:
    # A bucket of 10 ms of traffic keeps the rate smooth at the timescale of a collective while
    # letting tbf's timer keep up at high rates.
    burst = max(int(parse_rate(rate) / 100), MIN_BURST_BYTES)
    return ["tbf", "rate", rate, "burst", str(burst), "latency", TBF_LATENCY]


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace has an address on or a route to, the default route excepted."""
    words = [line.split() for line in _run(["ip", "-4", "-o", "addr", "show"]).splitlines()]
    prefixes = [w[w.index("inet") + 1] for w in words if "inet" in w]
    for route in _run(["ip", "-4", "route", "show", "table", "all"]).splitlines():
        # Lines start with the destination, or with a route type ("local", "broadcast", ...) and then it.
        for word in route.split()[:2]:
            if word[0].isdigit():
                prefixes.append(word)
                break
    return [ipaddress.IPv4Network(prefix, strict=False) for prefix in prefixes]


def _free_subnet(start: int, taken: list[ipaddress.IPv4Network] | None = None) -> ipaddress.IPv4Network:
    used = _used_networks() + (taken or [])
    subnets = list(PRIVATE_RANGE.subnets(new_prefix=PREFIX_LEN))
    # Starting at a per-cluster offset keeps concurrent clusters on different subnets. That is for
    # readability only: their hosts sit on separate bridges and the root namespace routes to none.
    for i in range(len(subnets)):
        subnet = subnets[(start + i) % len(subnets)]
        if not any(subnet.overlaps(network) for network in used):
            return subnet
    raise RuntimeError(f"no /{PREFIX_LEN} in {PRIVATE_RANGE} is free of the machine's addresses and routes")


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True, env=_tool_env()).returncode == 0


def _namespace_exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, name))


class NetnsCluster:
    """`hosts` emulated hosts on one bridge, each NIC optionally shaped to `rate` (tc syntax) in both directions.

    With `networks` > 1, every host gets a NIC on each of that many separate networks (eth0, eth1,
    ...), each network its own bridge and subnet, as a machine with one NIC per rail has.

    Use as a context manager; the hosts exist between enter and exit, and are gone afterwards.
    """

    def __init__(self, hosts: int, rate: str | None = None, networks: int = 1, mtu: int | None = None) -> None:
        if hosts < 1:
            raise ValueError(f"a cluster needs at least one host, not {hosts}")
        if not 1 <= networks <= 8:
            raise ValueError(f"a cluster has 1 to 8 networks, not {networks}")
        if rate is not None:
            parse_rate(rate)  # Fail here, not halfway through setting up.
        if mtu is not None:
            check_mtu(mtu)
        self.rate = rate
        self.mtu = mtu
        self._count = hosts
        self._networks = networks
        pid, serial = os.getpid(), next(_cluster_ids)
        self._serial = serial
        # The pid and a per-process serial make names unique across processes and clusters; hex keeps
        # interface names within 15 characters.
        self._tag = f"{pid:x}-{serial:x}"
        self.bridge = self._ifname("fb")
        self.bridges = [self.bridge] + [self._ifname("fb", f"n{n}") for n in range(1, networks)]
        self.hosts: list[Host] = []
        self._veths: list[str] = []
        self._namespaces: list[str] = []
        # Made under NETNS_ETC_DIR, in creation order; removed in reverse.
        self._etc_made: list[str] = []
        self._bridges_made: list[str] = []
        self._closed = False

    def __enter__(self) -> NetnsCluster:
        atexit.register(self._close_quietly)
        try:
            self._create()
        except BaseException:
            self._close_quietly()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
        else:
            self._close_quietly()

    def close(self) -> None:
        """Remove everything the cluster made; safe to call any number of times.

        Outer veths go first: deleting a veth end removes its peer at once, whereas a deleted
        namespace is torn down asynchronously, its veths lingering in the root namespace a while.
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._close_quietly)
        errors: list[str] = []
        for veth in self._veths:
            self._delete(["ip", "link", "del", "dev", veth], lambda v=veth: _link_exists(v), errors)
        for namespace in self._namespaces:
            self._delete(["ip", "netns", "del", namespace], lambda n=namespace: _namespace_exists(n), errors)
        for bridge in self._bridges_made:
            self._delete(["ip", "link", "del", "dev", bridge], lambda b=bridge: _link_exists(b), errors)
        for path in reversed(self._etc_made):
            try:
                if os.path.isdir(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as error:
                # Another cluster's folders keep a shared NETNS_ETC_DIR busy; the last one out removes it.
                if not (path == NETNS_ETC_DIR and error.errno == ENOTEMPTY):
                    errors.append(f"removing {path}: {error}")
        if errors:
            raise RuntimeError("cleaning up the network namespaces failed:\n" + "\n".join(errors))

    def exec_argv(self, host: Host, argv: list[str]) -> list[str]:
        """The command line that runs `argv` on `host`."""
        return ["ip", "netns", "exec", host.name, *argv]

    def set_link(self, host: Host, interface: str, up: bool) -> None:
        """Sets `host`'s NIC `interface` up or down, as a cable plugged in or pulled."""
        _run(self.exec_argv(host, ["ip", "link", "set", "dev", interface, "up" if up else "down"]))

    def counters(self, host: Host, interface: str | None = None) -> tuple[int, int]:
        """(tx_bytes, rx_bytes) of `host`'s NIC `interface` (default: its first, eth0)."""
        # `ip netns exec` mounts the namespace's own sysfs, so these are the host's eth0, not the machine's.
        statistics = f"/sys/class/net/{interface or host.interface}/statistics"
        tx, rx = _run(self.exec_argv(host, ["cat", f"{statistics}/tx_bytes", f"{statistics}/rx_bytes"])).split()
        return int(tx), int(rx)

    def _ifname(self, prefix: str, suffix: str = "") -> str:
        name = f"{prefix}{self._tag}{suffix}"
        if len(name) > MAX_IFNAME:
            raise ValueError(f"interface name {name!r} is longer than {MAX_IFNAME} characters")
        return name

    def _create(self) -> None:
        subnets: list[ipaddress.IPv4Network] = []
        for _ in range(self._networks):
            subnets.append(_free_subnet(start=os.getpid() + self._serial + len(subnets), taken=subnets))
        per_network = [list(subnet.hosts()) for subnet in subnets]
        if self._count > len(per_network[0]):
            raise ValueError(f"a /{PREFIX_LEN} holds at most {len(per_network[0])} hosts, not {self._count}")
        for bridge in self.bridges:
            _run(["ip", "link", "add", bridge, "type", "bridge"])
            self._bridges_made.append(bridge)
            _run(["ip", "link", "set", "dev", bridge, "up"])
        for index in range(self._count):
            self.hosts.append(self._create_host(index, [f"{a[index]}/{PREFIX_LEN}" for a in per_network]))
        try:
            for host in self.hosts:
                self._write_hosts_file(host)
        except OSError as error:
            # The hosts still work; only looking up names (and c10d's reverse lookups) falls back to DNS.
            warnings.warn(f"cannot write the hosts' /etc/hosts under {NETNS_ETC_DIR}: {error}", RuntimeWarning, 2)

    def _write_hosts_file(self, own: Host) -> None:
        """/etc/netns/<namespace>/hosts, which `ip netns exec` shows the host's processes as /etc/hosts."""
        try:
            os.mkdir(NETNS_ETC_DIR, 0o755)
            self._etc_made.append(NETNS_ETC_DIR)
        except FileExistsError:
            pass
        folder = os.path.join(NETNS_ETC_DIR, own.name)
        os.mkdir(folder, 0o755)  # The namespace is new, so an existing folder would be someone else's.
        self._etc_made.append(folder)
        path = os.path.join(folder, "hosts")
        self._etc_made.append(path)
        machine = socket.gethostname()
        lines = [f"# Written by fairring's NetnsCluster for {own.name}; removed with it."]
        lines += ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        for host in self.hosts:
            # The machine's hostname is this host's own name, reachable from the others, as on a real host.
            alias = f" {machine}" if host is own and machine and machine != "localhost" else ""
            lines.append(f"{host.address} {host.name}{alias}")
        # A dual-stack listener (c10d's TCPStore) sees IPv4 peers as v4-mapped IPv6 addresses, which glibc
        # looks up as such; with no DNS reachable from the namespace, a miss is an error, not a number.
        lines += [f"::ffff:{host.address} {host.name}" for host in self.hosts]
        lines.append("::ffff:127.0.0.1 localhost")
        with open(path, "x") as file:
            file.write("\n".join(lines) + "\n")
        os.chmod(path, 0o644)

    def _create_host(self, index: int, interface_addresses: list[str]) -> Host:
        namespace = f"fairring-{self._tag}-{index}"
        _run(["ip", "netns", "add", namespace])
        self._namespaces.append(namespace)
        _run(["ip", "-n", namespace, "link", "set", "dev", "lo", "up"])
        interfaces = []
        for network, (bridge, interface_address) in enumerate(zip(self.bridges, interface_addresses, strict=True)):
            inner = f"eth{network}"
            veth = self._ifname("fv", f"-{index:x}" + (f"n{network}" if network else ""))
            # The inner end is born with its name inside the namespace, so no transient name can clash in either.
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", inner, "netns", namespace])
            self._veths.append(veth)
            if self.mtu is not None:
                # Both ends: the bridge follows its ports' smallest MTU.
                _run(["ip", "link", "set", "dev", veth, "mtu", str(self.mtu)])
                _run(["ip", "-n", namespace, "link", "set", "dev", inner, "mtu", str(self.mtu)])
            _run(["ip", "-n", namespace, "addr", "add", interface_address, "dev", inner])
            _run(["ip", "-n", namespace, "link", "set", "dev", inner, "up"])
            _run(["ip", "link", "set", "dev", veth, "master", bridge])
            _run(["ip", "link", "set", "dev", veth, "up"])
            if self.rate is not None:
                # tbf shapes egress only: the inner end's is what the host sends, the outer end's what it receives.
                _run(["tc", "-n", namespace, "qdisc", "add", "dev", inner, "root", *_tbf_args(self.rate)])
                _run(["tc", "qdisc", "add", "dev", veth, "root", *_tbf_args(self.rate)])
            interfaces.append(inner)
        addresses = tuple(a.split("/")[0] for a in interface_addresses)
        return Host(name=namespace, address=addresses[0], interfaces=tuple(interfaces), addresses=addresses)

    @staticmethod
    def _delete(argv: list[str], exists: Callable[[], bool], errors: list[str]) -> None:
        # Something already gone (deleted by hand, or with its peer) is as good as deleted.
        try:
            _run(argv)
        except CommandError as error:
            if exists():
                errors.append(str(error))

    def _close_quietly(self) -> None:
        # Leaves the exception already in flight as the one the caller sees.
        try:
            self.close()
        except Exception as error:
            warnings.warn(str(error), RuntimeWarning, stacklevel=3)


def enter_namespace(name: str) -> None:
    """Move the calling process into the network namespace `name` (as made by `ip netns add`).

    setns(2) moves only the calling thread, and sockets keep the namespace they were made in, so
    call this first thing in a fresh process, before it starts threads or opens sockets. As `ip
    netns exec` does, the process then gets its own mount namespace with the namespace's sysfs on
    /sys: libraries that list interfaces from /sys/class/net (UCX does) see the host's NICs, not
    the machine's.
    """
    path = os.path.join(NETNS_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise OSError(error.errno, f"cannot open network namespace {name!r} ({path}): {error.strerror}") from error
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what} for network namespace {name!r} failed: {os.strerror(errno)}")

    try:
        check(libc.setns(fd, CLONE_NEWNET), f"setns into {path}")
    finally:
        os.close(fd)
    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Mounts made here stay here; the machine's /sys is left as it was.
    check(libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "making / a slave mount")
    check(libc.umount2(b"/sys", MNT_DETACH), "unmounting /sys")
    check(libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None), "mounting the namespace's sysfs on /sys")


@cache
def netns_available() -> tuple[bool, str]:
    """(True, "") if this process can build a `NetnsCluster` with shaping, else (False, why not)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` (iproute2) is not installed"
    try:
        _probe()
    except OSError as error:
        return False, f"cannot run iproute2: {error}"
    except CommandError as error:
        return False, f"cannot set up a shaped network namespace: {error}"
    return True, ""


def _probe() -> None:
    # Everything is tried inside a throwaway namespace, so a failed probe leaves nothing in the root namespace.
    namespace = f"fairring-probe-{os.getpid():x}-{uuid.uuid4().hex[:8]}"
    _run(["ip", "netns", "add", namespace])
    try:
        _run(["ip", "-n", namespace, "link", "add", "b0", "type", "bridge"])
        _run(["ip", "-n", namespace, "link", "add", "v0", "type", "veth", "peer", "name", "v1"])
        _run(["ip", "-n", namespace, "link", "set", "dev", "v0", "master", "b0"])
        _run(["tc", "-n", namespace, "qdisc", "add", "dev", "v1", "root", *_tbf_args("100mbit")])
    finally:
        _run(["ip", "netns", "del", namespace])
