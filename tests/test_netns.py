"""NetnsCluster: hosts that are really separate network stacks, shaped and counted, and always cleaned up."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest

from fairring.bench import netns
from fairring.bench.netns import Host, NetnsCluster, enter_namespace, netns_available

MIB = 1 << 20
PORT = 5201

SERVER = textwrap.dedent(
    """
    import socket, sys
    server = socket.create_server((sys.argv[1], int(sys.argv[2])))
    print("ready", flush=True)
    conn, _ = server.accept()
    total = 0
    while chunk := conn.recv(1 << 16):
        total += len(chunk)
    conn.sendall(str(total).encode())
    conn.close()
    """
)

# Times from connecting to the server's reply, which it sends only once it has read everything.
CLIENT = textwrap.dedent(
    """
    import socket, sys, time
    address, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    start = time.perf_counter()
    with socket.create_connection((address, port), timeout=60) as sock:
        sock.sendall(b"x" * size)
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(64):
            reply += chunk
    print(int(reply), time.perf_counter() - start)
    """
)

PROBE_LOOPBACK = textwrap.dedent(
    """
    import socket, sys
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
        print("connected")
    except ConnectionRefusedError:
        print("refused")
    except TimeoutError:
        print("timeout")
    """
)


# A datagram that just fits a frame of `mtu` (IPv4 and UDP headers: 28 bytes), sent with "don't
# fragment": the kernel refuses it (EMSGSIZE) if the route's MTU is smaller.
PROBE_FRAME = textwrap.dedent(
    """
    import socket, sys
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER, IP_PMTUDISC_DO (Python 3.12+ names them)
    try:
        sock.sendto(b"x" * (int(sys.argv[2]) - 28), (sys.argv[1], 9))
        print("sent")
    except OSError as error:
        print("refused", error.errno)
    """
)


@pytest.fixture(autouse=True, scope="module")
def _require_netns() -> None:
    # A fixture rather than a module-level skip, so that spawned workers importing this module probe nothing.
    available, reason = netns_available()
    if not available:
        pytest.skip(reason)


def _python(cluster: NetnsCluster, host: Host, code: str, *args: object) -> list[str]:
    return cluster.exec_argv(host, [sys.executable, "-c", code, *map(str, args)])


def _transfer(cluster: NetnsCluster, sender: Host, receiver: Host, size: int) -> tuple[int, float]:
    """Send `size` bytes over TCP from `sender` to `receiver`: (bytes received, seconds taken)."""
    server = subprocess.Popen(
        _python(cluster, receiver, SERVER, receiver.address, PORT), stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready"
        client = subprocess.run(
            _python(cluster, sender, CLIENT, receiver.address, PORT, size),
            check=True,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert server.wait(timeout=30) == 0
    finally:
        _stop(server)
    received, seconds = client.stdout.split()
    return int(received), float(seconds)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout


def _links() -> str:
    return subprocess.run(["ip", "link", "show"], check=True, capture_output=True, text=True).stdout


def _assert_gone(names: list[str], bridge: str) -> None:
    namespaces, links = _namespaces().split(), _links()
    for name in names:
        assert name not in namespaces
    assert f" {bridge}:" not in links
    assert f" {bridge.replace('fb', 'fv', 1)}-" not in links


@pytest.fixture
def pair() -> Iterator[NetnsCluster]:
    with NetnsCluster(2) as cluster:
        yield cluster


@pytest.mark.timeout(120)
def test_hosts_reach_each_other_and_count_their_traffic(pair: NetnsCluster) -> None:
    receiver, sender = pair.hosts
    assert receiver.address != sender.address
    tx_before, rx_before = pair.counters(sender)[0], pair.counters(receiver)[1]

    received, _ = _transfer(pair, sender, receiver, MIB)

    assert received == MIB
    tx, rx = pair.counters(sender)[0] - tx_before, pair.counters(receiver)[1] - rx_before
    print(f"\n1 MiB payload: sender tx {tx} B, receiver rx {rx} B")
    # Headers and the handshake add a little; anything beyond 20% would be traffic that is not this connection's.
    assert MIB <= tx < 1.2 * MIB
    assert MIB <= rx < 1.2 * MIB


@pytest.mark.timeout(120)
def test_host_cannot_reach_root_namespace_loopback(pair: NetnsCluster) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # Reachable from the root namespace.

        probe = subprocess.run(
            _python(pair, pair.hosts[0], PROBE_LOOPBACK, port), check=True, capture_output=True, text=True, timeout=30
        )

    assert probe.stdout.strip() in ("refused", "timeout")


@pytest.mark.timeout(120)
def test_rate_shapes_traffic() -> None:
    size = 8 * MIB
    with NetnsCluster(2, rate="100mbit") as cluster:
        received, shaped = _transfer(cluster, cluster.hosts[1], cluster.hosts[0], size)
    assert received == size
    with NetnsCluster(2) as cluster:
        _, unshaped = _transfer(cluster, cluster.hosts[1], cluster.hosts[0], size)
    print(f"\n8 MiB: {shaped:.3f} s at 100mbit (ideal {size * 8 / 100e6:.3f} s), {unshaped:.3f} s unshaped")
    # 0.67 s at exactly the rate; the token bucket starts full, so allow for one burst's head start.
    assert shaped >= 0.55


@pytest.mark.timeout(120)
def test_rate_is_checked_up_front() -> None:
    with pytest.raises(ValueError, match="tc rate"):
        NetnsCluster(2, rate="fast")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mtu", [None, 9000])
def test_mtu_sets_the_frames_the_hosts_send(mtu: int | None) -> None:
    with NetnsCluster(2, rate="1gbit", mtu=mtu) as cluster:
        sender, receiver = cluster.hosts

        def probe(size: int) -> str:
            argv = _python(cluster, sender, PROBE_FRAME, receiver.address, size)
            return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout.strip()

        assert probe(1500) == "sent"
        # A jumbo frame leaves only with jumbo frames set; else the kernel says it is too long.
        assert probe(9000) == ("sent" if mtu == 9000 else "refused 90")
        assert probe(9001) == "refused 90"


@pytest.mark.timeout(120)
def test_mtu_is_checked_up_front() -> None:
    with pytest.raises(ValueError, match="MTU is 576 to 9000 bytes, not 65536"):
        NetnsCluster(2, mtu=65536)


@pytest.mark.timeout(120)
def test_exit_removes_namespaces_and_bridge() -> None:
    with NetnsCluster(2, rate="1gbit") as cluster:
        names = [host.name for host in cluster.hosts]
        assert all(name in _namespaces().split() for name in names)
        assert f" {cluster.bridge}:" in _links()
    _assert_gone(names, cluster.bridge)
    cluster.close()  # Idempotent.


class _BodyError(Exception):
    pass


@pytest.mark.timeout(120)
def test_exit_cleans_up_when_the_body_raises() -> None:
    error = _BodyError()
    with pytest.raises(_BodyError) as raised, NetnsCluster(2) as cluster:
        names = [host.name for host in cluster.hosts]
        raise error
    assert raised.value is error
    _assert_gone(names, cluster.bridge)


@pytest.mark.timeout(120)
def test_cleanup_failure_does_not_mask_the_body_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Deleting the bridge behind the cluster's back, while pretending it is still there, makes cleanup fail.
    monkeypatch.setattr(netns, "_link_exists", lambda name: True)
    error = _BodyError()
    with pytest.raises(_BodyError) as raised, pytest.warns(RuntimeWarning, match="cleaning up"):
        with NetnsCluster(2) as cluster:
            subprocess.run(["ip", "link", "del", "dev", cluster.bridge], check=True)
            raise error
    assert raised.value is error
    with pytest.raises(RuntimeError, match="cleaning up"), NetnsCluster(2) as cluster:
        subprocess.run(["ip", "link", "del", "dev", cluster.bridge], check=True)
    monkeypatch.undo()
    _assert_gone([host.name for host in cluster.hosts], cluster.bridge)


@pytest.mark.timeout(120)
def test_exit_without_leaving_the_context_cleans_up() -> None:
    code = textwrap.dedent(
        """
        from fairring.bench.netns import NetnsCluster
        cluster = NetnsCluster(2).__enter__()
        print(cluster.bridge, *(host.name for host in cluster.hosts))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    bridge, *names = done.stdout.split()
    assert len(names) == 2
    _assert_gone(names, bridge)


def _report_from_namespace(host: Host, conn: Connection) -> None:
    try:
        enter_namespace(host.name)
        with socket.socket() as sock:
            sock.bind((host.address, 0))
        # The kernel's list, and /sys's: UCX and others read interfaces from /sys/class/net.
        conn.send((sorted(name for _, name in socket.if_nameindex()), sorted(os.listdir("/sys/class/net"))))
    except BaseException as error:
        conn.send(repr(error))
        raise


@pytest.mark.timeout(120)
def test_enter_namespace_moves_a_spawned_process(pair: NetnsCluster) -> None:
    host = pair.hosts[0]
    with socket.socket() as sock, pytest.raises(OSError):
        sock.bind((host.address, 0))  # The host's address does not exist in the root namespace.

    context = mp.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    worker = context.Process(target=_report_from_namespace, args=(host, send))
    worker.start()
    try:
        send.close()
        assert receive.poll(60)
        report = receive.recv()
        worker.join(timeout=30)
    finally:
        if worker.is_alive():
            worker.kill()
        worker.join()
        receive.close()

    assert report == (["eth0", "lo"], ["eth0", "lo"]), report
    assert worker.exitcode == 0
    # The machine's own /sys is untouched.
    assert sorted(os.listdir("/sys/class/net")) == sorted(name for _, name in socket.if_nameindex())


@pytest.mark.timeout(120)
def test_enter_namespace_names_the_missing_namespace() -> None:
    with pytest.raises(OSError, match="fairring-no-such-namespace"):
        enter_namespace("fairring-no-such-namespace")
