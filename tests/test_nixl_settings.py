"""The NIXL rails' settings (fairring/_nixl.py): the library, and which network devices their UCX uses (the
user's settings mapped onto UCX's own, one device per rail)."""

from __future__ import annotations

import pytest

from fairring import _nixl as nixl
from fairring._config import ConfigError, load_transport_settings
from fairring._infiniband import HostFacts, IbDevice, IbPort

SEGMENTS = {"UCX_TCP_TX_SEG_SIZE": "1m", "UCX_TCP_RX_SEG_SIZE": "1m"}


def hca(name: str, *ports: tuple[int, str], link: str = "InfiniBand", pci: str | None = None) -> IbDevice:
    return IbDevice(name, tuple(IbPort(number, state, link) for number, state in ports), pci)


def ucx(
    facts: HostFacts, rail: int = 0, gpu: int | None = None, interface: str = "eth1", **variables: str
) -> dict[str, str]:
    """The UCX variables fairring sets for `rail`, on `interface`, under the fairring `variables`."""
    env: dict[str, str] = {}
    nixl.choose_ucx_settings(interface, load_transport_settings(variables, tensorpipe=False), facts, rail, gpu, env)
    return env


def test_without_infiniband_ucx_keeps_to_network_transports_on_the_rails_interface() -> None:
    assert ucx(HostFacts()) == {"UCX_TLS": "^sm,cma,cuda_ipc", "UCX_NET_DEVICES": "eth1,lo", **SEGMENTS}
    # A port that is down is no device to use.
    assert ucx(HostFacts(devices=(hca("mlx5_0", (1, "DOWN")),)))["UCX_NET_DEVICES"] == "eth1,lo"
    with_ib = HostFacts(devices=(hca("mlx5_0", (1, "ACTIVE")),))
    assert ucx(with_ib, FAIRRING_IB_DISABLE="1")["UCX_NET_DEVICES"] == "eth1,lo"


def test_loopback_is_the_only_other_device_a_rail_gets() -> None:
    """Any other NIC would carry part of the rail (UCX spreads a transfer over them); loopback stays in the host."""
    assert ucx(HostFacts(), rail=1, interface="eth0")["UCX_NET_DEVICES"] == "eth0,lo"
    assert ucx(HostFacts(), interface="lo")["UCX_NET_DEVICES"] == "lo"


def test_the_users_own_ucx_settings_stay_and_are_said_to_be_theirs() -> None:
    env = {"UCX_TLS": "rc,cuda_copy", "UCX_NET_DEVICES": "mlx5_3:1", "UCX_TCP_TX_SEG_SIZE": "64k"}
    settings = load_transport_settings({}, tensorpipe=False)
    chosen = nixl.choose_ucx_settings("eth1", settings, HostFacts(), 0, None, env)
    assert env == {**SEGMENTS, "UCX_TLS": "rc,cuda_copy", "UCX_NET_DEVICES": "mlx5_3:1", "UCX_TCP_TX_SEG_SIZE": "64k"}
    assert chosen.count("(yours)") == 3, chosen


def test_each_rail_gets_its_own_device_in_turn_without_gpus() -> None:
    facts = HostFacts(devices=(hca("mlx5_0", (1, "ACTIVE")), hca("mlx5_1", (1, "ACTIVE"))))
    assert [ucx(facts, rail)["UCX_NET_DEVICES"] for rail in range(3)] == ["mlx5_0:1", "mlx5_1:1", "mlx5_0:1"]


def test_a_gpu_rank_uses_the_device_nearest_its_gpu() -> None:
    facts = HostFacts(
        devices=(
            hca("mlx5_0", (1, "ACTIVE"), pci="/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"),
            hca("mlx5_1", (1, "ACTIVE"), pci="/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0"),
        ),
        gpus=(
            "/sys/devices/pci0000:80/0000:80:01.0/0000:82:00.0",
            "/sys/devices/pci0000:00/0000:00:01.0/0000:02:00.0",
        ),
    )
    assert ucx(facts, rail=0, gpu=0)["UCX_NET_DEVICES"] == "mlx5_1:1"
    assert ucx(facts, rail=1, gpu=1)["UCX_NET_DEVICES"] == "mlx5_0:1"


def test_ib_hca_and_gid_index_reach_ucx_with_any_port() -> None:
    facts = HostFacts(
        devices=(hca("mlx5_0", (1, "ACTIVE")), hca("mlx5_1", (1, "ACTIVE"), (2, "ACTIVE"), link="Ethernet"))
    )
    env = ucx(facts, FAIRRING_IB_HCA="=mlx5_1:2", FAIRRING_IB_GID_INDEX="3")
    assert env["UCX_NET_DEVICES"] == "mlx5_1:2" and env["UCX_IB_GID_INDEX"] == "3", env
    assert ucx(facts, FAIRRING_IB_HCA="^mlx5_0")["UCX_NET_DEVICES"] == "mlx5_1:1"
    # A GID index is InfiniBand's: on TCP there is nothing to set.
    assert "UCX_IB_GID_INDEX" not in ucx(HostFacts(), FAIRRING_IB_GID_INDEX="3")


def test_an_ib_hca_that_selects_nothing_names_the_devices() -> None:
    facts = HostFacts(devices=(hca("mlx5_0", (1, "ACTIVE"), (2, "DOWN")),))
    with pytest.raises(ConfigError, match=r"FAIRRING_IB_HCA='mlx5_0:2' selects no active .*mlx5_0"):
        ucx(facts, FAIRRING_IB_HCA="mlx5_0:2")


def test_settings_only_nixl_can_honour_are_refused_for_tensorpipe_saying_so() -> None:
    with pytest.raises(ConfigError, match="FAIRRING_RAILS_TRANSPORT=nixl"):
        load_transport_settings({"FAIRRING_IB_GID_INDEX": "3"})
    with pytest.raises(ConfigError, match="FAIRRING_RAILS_TRANSPORT=nixl"):
        load_transport_settings({"FAIRRING_IB_HCA": "mlx5_0:2"})
    with pytest.raises(ConfigError, match="not a GID index"):
        load_transport_settings({"FAIRRING_IB_GID_INDEX": "three"}, tensorpipe=False)


def test_nixl_rails_without_nixl_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nixl, "NIXL_MODULES", ("no_such_nixl_module",))
    with pytest.raises(ConfigError, match=r"pip install 'nixl-cu13>=1.4'"):
        nixl.nixl_library()
