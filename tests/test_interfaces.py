"""Interface selection (fairring/_interfaces.py): the grammar, NCCL's automatic order, one NIC per rail.

Pure: each case is a made-up host (a list of interface addresses), so every
rule is checked without touching this machine's network. The namespace test
(tests/test_rails_interfaces.py) proves the choices on real interfaces.
"""

from __future__ import annotations

import pytest

from fairring import _C
from fairring._config import ConfigError, load_config
from fairring._interfaces import InterfaceAddress, choose_rail_interface, host_addresses


def v4(name: str, address: str, up: bool = True) -> InterfaceAddress:
    return InterfaceAddress(name, "ipv4", address, up=up, loopback=name.startswith("lo"))


def v6(name: str, address: str, link_local: bool = False) -> InterfaceAddress:
    return InterfaceAddress(name, "ipv6", address, loopback=name.startswith("lo"), link_local=link_local)


# A GPU server: loopback, a docker bridge, two NICs numbered so that sorting
# by text would put eth10 before eth2, IPoIB, and a down NIC.
SERVER = [
    v4("lo", "127.0.0.1"),
    v4("docker0", "172.17.0.1"),
    v4("eth10", "10.0.10.5"),
    v4("eth2", "10.0.2.5"),
    v4("ib0", "10.1.0.5"),
    v4("ib1", "10.1.1.5"),
    v4("eth3", "10.0.3.5", up=False),
    v6("eth2", "fd00::2"),
    v6("eth2", "fe80::1", link_local=True),
    v6("lo", "::1"),
]


def chosen(env: dict[str, str], local_rank: int = 0, host: list[InterfaceAddress] = SERVER) -> tuple[str, str]:
    rail = choose_rail_interface(load_config(env), local_rank, host)
    return rail.name, rail.address


def rails_of(env: dict[str, str], rails: int, host: list[InterfaceAddress] = SERVER) -> list[str]:
    return [chosen(env, rail, host)[0] for rail in range(rails)]


def test_automatic_prefers_ipoib_as_nccl_does() -> None:
    assert rails_of({}, 4) == ["ib0", "ib1", "ib0", "ib1"]


def test_automatic_skips_loopback_and_docker_unless_nothing_else_exists() -> None:
    no_ib = [a for a in SERVER if not a.name.startswith("ib")]
    assert rails_of({}, 2, no_ib) == ["eth2", "eth10"]  # natural order, eth3 is down
    assert chosen({}, 0, [v4("lo", "127.0.0.1"), v4("docker0", "172.17.0.1")]) == ("docker0", "172.17.0.1")
    assert chosen({}, 0, [v4("lo", "127.0.0.1")]) == ("lo", "127.0.0.1")


@pytest.mark.parametrize(
    ("value", "rails"),
    [
        ("eth", ["eth2", "eth10", "eth2", "eth10"]),  # prefixes, natural order, down eth3 left out
        ("=eth10", ["eth10"] * 4),  # exact
        ("=eth10,eth2", ["eth10", "eth2", "eth10", "eth2"]),  # exact, in the order written
        ("^docker,lo,ib", ["eth2", "eth10", "eth2", "eth10"]),  # exclusion
        # Exact exclusion: everything else that is up takes part, docker0 too; lo never joins others.
        ("^=ib0", ["docker0", "eth2", "eth10", "ib1"]),
        ("et,i", ["eth2", "eth10", "ib0", "ib1"]),  # several prefixes merge into one natural order
    ],
)
def test_grammar_and_one_nic_per_rail(value: str, rails: list[str]) -> None:
    assert rails_of({"FAIRRING_SOCKET_IFNAME": value}, 4) == rails


def test_a_loopback_interface_never_joins_other_interfaces() -> None:
    # lo matches '^eth' but would leave a rail unable to reach other machines.
    host = [v4("lo", "127.0.0.1"), v4("eth0", "10.0.0.1"), v4("ens1", "10.0.1.1")]
    assert rails_of({"FAIRRING_SOCKET_IFNAME": "^eth"}, 2, host) == ["ens1", "ens1"]
    # Named on its own, it is what the user asked for (one machine, or tests).
    assert chosen({"FAIRRING_SOCKET_IFNAME": "lo"}, 1, host) == ("lo", "127.0.0.1")


def test_tp_socket_ifname_names_exact_interfaces_and_yields_to_fairring_s_variable() -> None:
    assert chosen({"TP_SOCKET_IFNAME": "eth2"}, 1) == ("eth2", "10.0.2.5")
    with pytest.raises(ConfigError, match="TP_SOCKET_IFNAME '=eth' matches no usable network interface"):
        chosen({"TP_SOCKET_IFNAME": "eth"})
    assert chosen({"TP_SOCKET_IFNAME": "eth2", "FAIRRING_SOCKET_IFNAME": "ib1"}) == ("ib1", "10.1.1.5")


def test_no_match_fails_listing_the_interfaces_that_exist() -> None:
    with pytest.raises(ConfigError) as error:
        chosen({"FAIRRING_SOCKET_IFNAME": "=eth3,bond"})
    message = str(error.value)
    assert "FAIRRING_SOCKET_IFNAME '=eth3,bond' matches no usable network interface" in message
    for listed in ("lo (127.0.0.1; ::1)", "eth3 (10.0.3.5 down)", "eth2 (10.0.2.5; fd00::2; fe80::1 link-local)"):
        assert listed in message, message


def test_address_family() -> None:
    assert chosen({"FAIRRING_SOCKET_IFNAME": "eth2"}) == ("eth2", "10.0.2.5")  # IPv4 first
    assert chosen({"FAIRRING_SOCKET_IFNAME": "eth", "FAIRRING_SOCKET_FAMILY": "AF_INET6"}) == ("eth2", "fd00::2")
    with pytest.raises(ConfigError, match=r"only IPv6 addresses count: FAIRRING_SOCKET_FAMILY"):
        chosen({"FAIRRING_SOCKET_IFNAME": "ib", "FAIRRING_SOCKET_FAMILY": "AF_INET6"})


def test_rail_mapping_overrides() -> None:
    assert rails_of({"FAIRRING_SOCKET_IFNAME": "eth", "FAIRRING_RAIL_INTERFACES": "shared"}, 3) == ["eth2"] * 3
    env = {"FAIRRING_SOCKET_IFNAME": "eth,ib", "FAIRRING_RAIL_INTERFACES": "ib1,eth10"}
    assert rails_of(env, 3) == ["ib1", "eth10", "ib1"]
    with pytest.raises(ConfigError, match=r"FAIRRING_RAIL_INTERFACES=ib0,eth3 names eth3, which is not among"):
        chosen({"FAIRRING_RAIL_INTERFACES": "ib0,eth3"})


def test_the_host_listing_is_the_kernel_s() -> None:
    listed = host_addresses()
    assert any(a.name == "lo" and a.address == "127.0.0.1" and a.loopback and a.up for a in listed)
    assert {a.family for a in listed} <= {"ipv4", "ipv6"}
    assert all("%" not in a.address for a in listed)
    assert len(_C.interface_addresses()) == len(listed)
