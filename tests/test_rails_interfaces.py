"""Proof on real networks that the rails leave through the interfaces chosen, one NIC per rail.

Each emulated machine is a host (a network namespace) with two NICs on two
separate networks, eth0 and eth1, as a machine with one NIC per rail has. The
store and Gloo stay on eth0 (the harness's GLOO_SOCKET_IFNAME); the rails go
where FAIRRING_SOCKET_IFNAME sends them. Per-interface byte counters, read
around one all-reduce, show which NIC carried the rails' traffic: with M
machines an all-reduce of S bytes sends about 2(M-1)/M x S per host, and each
of the L rails 1/L of that.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

import fairring
from benchmarks.failover_driver import bytes_sent, difference
from benchmarks.harness import Layout, RankFailure, RankPool
from benchmarks.reference import all_ranks_reduced, assert_matches, rank_tensor
from fairring.bench.netns import NetnsCluster, netns_available
from nixl_support import RAILS_TRANSPORTS, needs_nixl, rails_env

MiB = 1 << 20
SIZE = 8 * MiB
LAYOUT = Layout(2, 2)
_state: dict[str, object] = {}


@pytest.fixture(scope="module")
def cluster() -> NetnsCluster:
    available, reason = netns_available()
    if not available:
        pytest.skip(f"network namespaces unavailable: {reason}")
    with NetnsCluster(LAYOUT.machines, networks=2) as made:
        yield made


def build_rails() -> dict[str, object]:
    """Makes the engine (and its rails) with a first all-reduce; returns where they listen."""
    _state["tensor"] = rank_tensor(dist.get_rank(), (SIZE // 4,), torch.float32)
    dist.all_reduce(torch.ones(4096))
    return fairring.backend_of().rails()


def all_reduce_prepared() -> None:
    tensor = _state["tensor"].clone()
    dist.all_reduce(tensor)
    assert_matches(tensor, all_ranks_reduced((SIZE // 4,), torch.float32))


def sent_during(
    cluster: NetnsCluster, ranks: RankPool, action: Callable[[], object]
) -> tuple[list[object], dict[str, list[int]]]:
    """What `action` returned on each rank, and the bytes each interface of each host sent while it ran."""
    before = bytes_sent(cluster)
    results = ranks.run(action)
    return results, difference(bytes_sent(cluster), before)


def rails_bytes(
    cluster: NetnsCluster, env: dict[str, str], layout: Layout = LAYOUT
) -> tuple[list[dict[str, object]], dict[str, list[int]]]:
    """Each rank's rails description, and the bytes each interface of each host sent during one all-reduce."""
    rank_env = {rank: env for rank in range(layout.world_size)}
    with RankPool(layout, hosts=cluster.hosts, rank_env=rank_env) as ranks:
        described = ranks.run(build_rails)
        _, sent = sent_during(cluster, ranks, all_reduce_prepared)
    return described, sent


def address_on(cluster: NetnsCluster, rank: int, interface: str) -> str:
    host = cluster.hosts[LAYOUT.machine_of(rank)]
    return host.addresses[host.interfaces.index(interface)]


def assert_sent(sent: dict[str, list[int]], expected: dict[str, float]) -> None:
    for interface, share in expected.items():
        for host_bytes in sent[interface]:
            if share == 0:
                # Only heartbeats and the store's keep-alives may cross it.
                assert host_bytes < 0.01 * SIZE, sent
            else:
                # Payload plus Ethernet/IP/TCP framing and ACKs (well under 10%).
                assert share <= host_bytes <= 1.10 * share, sent


PER_HOST = 2 * (LAYOUT.machines - 1) / LAYOUT.machines * SIZE
PER_RAIL = PER_HOST / LAYOUT.ranks_per_machine


# How FAIRRING_SOCKET_IFNAME and FAIRRING_RAIL_INTERFACES choose each rail's NIC: the choice is the
# transports' common code, each transport's binding to it their own.
INTERFACE_CHOICES = {
    # Prefixes: both NICs match, so rail i takes the i-th: each carries its rail's share.
    "prefix": ({"FAIRRING_SOCKET_IFNAME": "eth"}, ["eth0", "eth1"], {"eth0": PER_RAIL, "eth1": PER_RAIL}),
    # An exact name: every rail on eth1, nothing on eth0.
    "exact": ({"FAIRRING_SOCKET_IFNAME": "=eth1"}, ["eth1", "eth1"], {"eth0": 0, "eth1": PER_HOST}),
    # An exclusion: eth1 is left (lo never joins a NIC).
    "exclude": ({"FAIRRING_SOCKET_IFNAME": "^eth0"}, ["eth1", "eth1"], {"eth0": 0, "eth1": PER_HOST}),
    # The rail mapping reversed.
    "mapping": (
        {"FAIRRING_SOCKET_IFNAME": "eth", "FAIRRING_RAIL_INTERFACES": "eth1,eth0"},
        ["eth1", "eth0"],
        {"eth0": PER_RAIL, "eth1": PER_RAIL},
    ),
}


def interface_cases() -> list[object]:
    """Every choice on TensorPipe; on NIXL, prefixes (a rail per NIC) in CI and the rest in the extended tier
    (8 to 10 s each on 2 cores): the choice is common code, which the TensorPipe cases cover."""
    cases = []
    for choice, case in INTERFACE_CHOICES.items():
        cases.append(pytest.param("tensorpipe", *case, id=f"{choice}-tensorpipe"))
        tier = () if choice == "prefix" else (pytest.mark.extended,)
        cases.append(pytest.param("nixl", *case, marks=(needs_nixl, *tier), id=f"{choice}-nixl"))
    return cases


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("transport", "env", "rail_interfaces", "expected"), interface_cases())
def test_rails_traffic_leaves_through_the_chosen_interfaces(
    cluster: NetnsCluster, transport: str, env: dict[str, str], rail_interfaces: list[str], expected: dict[str, float]
) -> None:
    described, sent = rails_bytes(cluster, {**env, **rails_env(transport)})
    print(f"\n{transport}, {env}: bytes sent per host during one {SIZE}-byte all-reduce: {sent}")
    for rank, said in enumerate(described):
        interface = rail_interfaces[LAYOUT.ranks_of(LAYOUT.machine_of(rank)).index(rank)]
        assert (said["transport"], said["interface"]) == (transport, interface), said
        assert said["address"] == address_on(cluster, rank, interface), said
        rails = str(said["description"])
        if transport == "tensorpipe":
            # The listener is bound to that interface's address, and only to it.
            assert f"uv://{address_on(cluster, rank, interface)}:" in rails and f"({interface};" in rails, rails
        else:
            # UCX was given that interface and loopback (UCX_NET_DEVICES); the byte counts show it kept to it.
            assert f" on {interface};" in rails, rails
    assert_sent(sent, expected)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", RAILS_TRANSPORTS)
def test_each_rail_keeps_to_its_own_nic(cluster: NetnsCluster, transport: str) -> None:
    """Three rails on two NICs: eth0 carries rails 0 and 2, eth1 rail 1, so 2/3 and 1/3 of the bytes.

    A transport that spread each rail over both NICs (as UCX does over every device it is given)
    would send half through each, and pass a 2x2 test with one rail per NIC just as well.
    """
    layout = Layout(LAYOUT.machines, 3)
    _, sent = rails_bytes(cluster, {"FAIRRING_SOCKET_IFNAME": "eth", **rails_env(transport)}, layout)
    print(f"\n{transport}, 3 rails on 2 NICs: bytes sent per host during one {SIZE}-byte all-reduce: {sent}")
    # The shards of a 3-rail split differ by at most one element per slice.
    per_host = 2 * (layout.machines - 1) / layout.machines * SIZE * 0.999
    assert_sent(sent, {"eth0": 2 * per_host / 3, "eth1": per_host / 3})


def subgroup_all_reduce() -> tuple[str, int]:
    """Ranks 1 and 3, rail 1 of the world group, form a group of one rail: rail 0, so eth0.

    Its rails, and the bytes they received.
    """
    group = dist.new_group([1, 3], backend="fairring")
    rails, received = "", 0
    if dist.get_rank() in (1, 3):
        tensor = _state["tensor"].clone()
        dist.all_reduce(tensor, group=group)
        expected = rank_tensor(1, tensor.shape, torch.float32) + rank_tensor(3, tensor.shape, torch.float32)
        assert_matches(tensor, expected)
        rails = fairring.backend_of(group).rails()["description"]
        received = fairring.backend_of(group).engine_stats()["rail_bytes_received"]
    dist.destroy_process_group(group)
    return rails, received


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", RAILS_TRANSPORTS)
def test_a_subgroup_s_rails_take_the_interface_of_their_own_rail(cluster: NetnsCluster, transport: str) -> None:
    """A rank on rail 1 of the world group is on rail 0 of a subgroup: its rails there use eth0 only."""
    env = {"FAIRRING_SOCKET_IFNAME": "eth", **rails_env(transport)}
    with RankPool(LAYOUT, hosts=cluster.hosts, rank_env=dict.fromkeys(range(LAYOUT.world_size), env)) as ranks:
        ranks.run(build_rails)
        described, sent = sent_during(cluster, ranks, subgroup_all_reduce)
    print(f"\n{transport}: bytes sent per host during the subgroup's {SIZE}-byte all-reduce: {sent}")
    for rank in (1, 3):  # the rails carried it (not Gloo, which is on eth0 too), from eth0
        rails, received = described[rank]
        assert received >= SIZE // 2 and ("(eth0;" in rails or " on eth0;" in rails), described[rank]
    assert_sent(sent, {"eth0": SIZE, "eth1": 0})


@pytest.mark.timeout(120)
def test_an_interface_that_matches_nothing_fails_init_listing_the_host_s(cluster: NetnsCluster) -> None:
    rank_env = {rank: {"FAIRRING_SOCKET_IFNAME": "=eth7"} for rank in range(LAYOUT.world_size)}
    pool = RankPool(LAYOUT, hosts=cluster.hosts, rank_env=rank_env)
    try:
        pool.start(init=False)
        with pytest.raises(RankFailure) as failure:
            pool.init()
    finally:
        pool.close()
    for rank, outcome in failure.value.outcomes.items():
        assert "FAIRRING_SOCKET_IFNAME '=eth7' matches no usable network interface" in outcome, outcome
        for interface in ("eth0", "eth1"):
            assert f"{interface} ({address_on(cluster, rank, interface)}" in outcome, outcome
