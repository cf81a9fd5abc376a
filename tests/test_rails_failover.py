"""Rails that fail over: a rail's NIC set down mid-training, on real network namespaces.

Each emulated machine is a host with two NICs on two networks, eth0 and eth1,
and FAIRRING_SOCKET_IFNAME=eth puts rail 0 on eth0 and rail 1 on eth1 (the
layout of tests/test_rails_interfaces.py). All-reduces run without pause while
the test sets machine 1's eth1 down, and later up again; every result is
checked (benchmarks/failover_driver.py). The hosts' byte counters show which NIC
carried the rails before, during and after. The negative control turns
failover off: the same episode then fails, as it always did.
The long, timed episode is benchmarks/failover_episode.py (make failover-episode).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from documented_logs import assert_reads_as_documented
from test_emulated_device import EMULATED_ENV

from benchmarks.failover_driver import all_reduces, all_reduces_for, bytes_sent, difference, prepare, rails
from benchmarks.harness import InitSpec, Layout, RankFailure, RankPool
from fairring._infiniband import SYSFS_INFINIBAND
from fairring.bench.netns import NetnsCluster, netns_available
from nixl_support import RAILS_TRANSPORTS, rails_env

MiB = 1 << 20
SIZE = 4 * MiB
LAYOUT = Layout(2, 2)
ENV = {"FAIRRING_SOCKET_IFNAME": "eth", "FAIRRING_RAILS_TRANSPORT": "tensorpipe", "FAIRRING_RAIL_FAILOVER": "1"}
PER_HOST = 2 * (LAYOUT.machines - 1) / LAYOUT.machines * SIZE
PER_RAIL = PER_HOST / LAYOUT.ranks_per_machine
COUNT = 4


@pytest.fixture()
def cluster() -> NetnsCluster:
    available, reason = netns_available()
    if not available:
        pytest.skip(f"network namespaces unavailable: {reason}")
    with NetnsCluster(LAYOUT.machines, networks=2) as made:
        yield made


def pool(cluster: NetnsCluster, timeout_s: float, **env: str) -> RankPool:
    spec = InitSpec(method="tcp", host=cluster.hosts[0].address, port=29500, timeout=timedelta(seconds=timeout_s))
    return RankPool(LAYOUT, spec=spec, hosts=cluster.hosts, rank_env={r: {**ENV, **env} for r in range(4)})


def sent_during(cluster: NetnsCluster, ranks: RankPool) -> dict[str, list[int]]:
    """Bytes each interface of each host sent during COUNT all-reduces."""
    before = bytes_sent(cluster)
    ranks.run(all_reduces, COUNT)
    return difference(bytes_sent(cluster), before)


def assert_carried(sent: dict[str, list[int]], expected: dict[str, float]) -> None:
    for interface, share in expected.items():
        for host_bytes in sent[interface]:
            if share == 0:
                # Heartbeats, acknowledgements and the store's keep-alives only.
                assert host_bytes < 0.01 * SIZE * COUNT, sent
            else:
                # Payload plus Ethernet/IP/TCP framing and ACKs (well under 10%).
                assert share * COUNT <= host_bytes <= 1.10 * share * COUNT, sent


def run_through(ranks: RankPool, seconds: float, during: Callable[[], None]) -> list[list[tuple[float, float]]]:
    """All-reduces on every rank for `seconds` while `during()` runs here; each rank's times."""
    result: dict[str, object] = {}

    def reduce() -> None:
        try:
            result["times"] = ranks.run(all_reduces_for, seconds, timeout=seconds + 60)
        except BaseException as error:  # re-raised below, in the test's thread
            result["error"] = error

    thread = threading.Thread(target=reduce)
    thread.start()
    try:
        during()
    finally:
        thread.join()
    if "error" in result:
        raise result["error"]
    return result["times"]


def has_infiniband() -> bool:
    devices = Path("/") / SYSFS_INFINIBAND
    return devices.is_dir() and any(devices.iterdir())


def after(seconds: float, action: Callable[[], None]) -> Callable[[], None]:
    def delayed() -> None:
        time.sleep(seconds)
        action()

    return delayed


@pytest.mark.timeout(240)
def test_a_rail_whose_nic_goes_down_moves_to_the_other_nic_and_back(
    cluster: NetnsCluster, capfd: pytest.CaptureFixture[str]
) -> None:
    with pool(cluster, timeout_s=20, FAIRRING_LOG_LEVEL="INFO") as ranks:
        described = ranks.run(prepare, SIZE)
        assert all("failover to eth" in text for text in described), described
        before = sent_during(cluster, ranks)
        assert_carried(before, {"eth0": PER_RAIL, "eth1": PER_RAIL})

        # Down in the middle of a stream of all-reduces: the ones in flight complete.
        episode = run_through(ranks, 4.0, after(1.0, lambda: cluster.set_link(cluster.hosts[1], "eth1", up=False)))
        moved = ranks.run(rails)
        during = sent_during(cluster, ranks)
        # Both rails on eth0 now; machine 0's eth1 idles, its peer's being down.
        assert_carried(during, {"eth0": PER_HOST, "eth1": 0})

        run_through(ranks, 4.0, after(0.5, lambda: cluster.set_link(cluster.hosts[1], "eth1", up=True)))
        back = ranks.run(rails)
        returned = sent_during(cluster, ranks)
        assert_carried(returned, {"eth0": PER_RAIL, "eth1": PER_RAIL})
    print(f"\nbytes sent per host during {COUNT} all-reduces of {SIZE} bytes: before {before}")
    print(f"while machine 1's eth1 is down: {during}; after it came back: {returned}")
    print(f"all-reduces through the episode: {len(episode[0])}, the slowest {max(t for _, t in episode[0]):.3f} s")
    print("rails of rank 3 while down:", moved[3], "\nand after:", back[3])
    for rank in (1, 3):  # rail 1's ranks switched twice: off eth1, and back
        assert "2 switch(es)" in back[rank], back[rank]
        assert f"rank {4 - rank} through eth0" in moved[rank], moved[rank]
    for rank in (0, 2):
        assert "0 switch(es)" in back[rank], back[rank]
    logged = capfd.readouterr().err.splitlines()
    warnings = [line for line in logged if "interface eth1 is down" in line]
    assert len(warnings) == 1 and "rank 3 moves its rails' connections to rank(s) 1 to eth0" in warnings[0], warnings
    assert_reads_as_documented(warnings[0], "docs/configuration.md", "is down: rank")
    # The docs' example of the rails' INFO line is this layout's (2 hosts x 2 ranks, two NICs each).
    [chosen] = [line for line in logged if "rank 3 (machine 1 of 2, rail 1): rails on eth1 " in line]
    if has_infiniband():
        print("the rails' line names this machine's InfiniBand devices, not networking.md's; not compared")
    else:
        assert_reads_as_documented(chosen, "docs/networking.md", "rails on eth1")


@pytest.mark.timeout(180)
def test_on_a_launch_order_device_the_ops_in_flight_complete_too(cluster: NetnsCluster) -> None:
    """The CUDA engine's ordering (the emulated device, tests/test_emulated_device.py): kept staging, resent."""
    emulated = {"FAIRRING_TEST_EMULATED_DEVICE": "seed=7", **EMULATED_ENV}
    with pool(cluster, timeout_s=20, **emulated) as ranks:
        ranks.run(prepare, SIZE)
        run_through(ranks, 3.0, after(1.0, lambda: cluster.set_link(cluster.hosts[1], "eth1", up=False)))
        moved = ranks.run(rails)
        run_through(ranks, 3.0, after(0.5, lambda: cluster.set_link(cluster.hosts[1], "eth1", up=True)))
        back = ranks.run(rails)
    print("\nrails of rank 3 while down:", moved[3], "\nand after:", back[3])
    for rank in (1, 3):
        assert f"rank {4 - rank} through eth0" in moved[rank], moved[rank]
        assert "2 switch(es)" in back[rank], back[rank]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", RAILS_TRANSPORTS)
def test_without_failover_the_same_episode_fails(cluster: NetnsCluster, transport: str) -> None:
    """Failover off, or the NIXL rails (which cannot fence a rail's old connections): the job fails, naming it."""
    with pool(cluster, timeout_s=5, FAIRRING_RAIL_FAILOVER="0", **rails_env(transport)) as ranks:
        described = ranks.run(prepare, SIZE)
        assert not any("failover to" in text for text in described), described
        with pytest.raises(RankFailure) as failure:
            run_through(ranks, 4.0, after(1.0, lambda: cluster.set_link(cluster.hosts[1], "eth1", up=False)))
    outcomes = failure.value.outcomes
    for rank, text in sorted(outcomes.items()):
        print(f"\n{transport}, rank {rank}: {text.strip().splitlines()[-1][:300]}")
    # Every rank fails, naming the NIC, or rank 3 where a peer's timeout came first.
    assert sorted(outcomes) == [0, 1, 2, 3], outcomes
    assert all("interface eth1 is down" in text or "rank(s) 3" in text for text in outcomes.values()), outcomes
