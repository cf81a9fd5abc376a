"""The rails' transport and channel decision: parsing, the decision table, discovery. No processes, no hardware."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest
from documented_logs import assert_reads_as_documented

from fairring._config import ConfigError, load_config, load_transport_settings, parse_ib_hca
from fairring._infiniband import (
    ForkFacts,
    HostFacts,
    IbDevice,
    IbPort,
    ImportState,
    VerbsProbe,
    fork_facts,
    ibverbs_mapped,
    probe_host,
    read_import_state,
)
from fairring._interfaces import InterfaceAddress, choose_rail_interface
from fairring._rails_network import rails_line
from fairring._transports import (
    RailsTransports,
    decide,
    fork_verdict,
    map_gpus_to_nics,
    needs_infiniband,
    rails_transports,
)

PCI_ROOT = "/sys/devices/pci0000:00"
STATE_CODES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}


def device(name: str, state: str = "ACTIVE", link: str = "InfiniBand", pci: str | None = None) -> IbDevice:
    return IbDevice(name, (IbPort(1, state, link),), pci)


def host(
    *devices: IbDevice, gpus: int | tuple[str | None, ...] = 0, peer_memory: str | None = None, **fields: object
) -> HostFacts:
    """Facts with `devices` in libibverbs' order; `gpus`: how many (PCI paths unknown), or their paths."""
    paths = (None,) * gpus if isinstance(gpus, int) else gpus
    return HostFacts(devices=devices, gpus=paths, peer_memory=peer_memory, **fields)  # type: ignore[arg-type]


def decision(env: Mapping[str, str], facts: HostFacts, cuda: bool = False) -> RailsTransports:
    return decide(load_transport_settings(env), facts, cuda)


IB0, IB1 = device("mlx5_0"), device("mlx5_1")
GDR_HOST = {"gpus": 2, "peer_memory": "nvidia-peermem"}


# --- parsing -----------------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_unset_and_empty_variables_are_automatic() -> None:
    for env in ({}, {"FAIRRING_TRANSPORTS": " ", "FAIRRING_CHANNELS": "", "FAIRRING_IB_HCA": ""}):
        settings = load_transport_settings(env)
        assert settings.transports is None and settings.channels is None and settings.ib_hca is None


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("raw", "names", "exclude"),
    [
        ("ibv", ("ibv",), False),
        (" IBV , uv ", ("ibv", "uv"), False),
        ("^ibv", ("ibv",), True),
        ("uv,uv", ("uv",), False),
    ],
)
def test_transport_lists_follow_nccl_grammar(raw: str, names: tuple[str, ...], exclude: bool) -> None:
    transports = load_transport_settings({"FAIRRING_TRANSPORTS": raw}).transports
    assert transports is not None and transports.names == names and transports.exclude is exclude


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FAIRRING_TRANSPORTS": "shm"}, "shm moves data through shared memory between processes of one host"),
        ({"FAIRRING_TRANSPORTS": "shm"}, "but rails peers are always on other machines, so the rails use only network"),
        ({"FAIRRING_TRANSPORTS": "ibv,shm"}, "other machines"),
        ({"FAIRRING_TRANSPORTS": "tcp"}, "unknown transport 'tcp'; expected a comma-separated list of ibv, uv"),
        ({"FAIRRING_TRANSPORTS": "^"}, "names no transport"),
        ({"FAIRRING_TRANSPORTS": ","}, "names no transport"),
        ({"FAIRRING_TRANSPORTS": "^uv"}, "uv cannot be left out"),
        ({"FAIRRING_TRANSPORTS": "^ibv,uv"}, "To require InfiniBand, list it: FAIRRING_TRANSPORTS=ibv"),
        ({"FAIRRING_CHANNELS": "cma"}, "cma moves data through cross-memory attach"),
        ({"FAIRRING_CHANNELS": "cuda_ipc"}, "rails peers are always on other machines"),
        ({"FAIRRING_CHANNELS": "cuda_xth"}, "rails peers are always on other machines"),
        ({"FAIRRING_CHANNELS": "^xth"}, "rails peers are always on other machines"),
        ({"FAIRRING_CHANNELS": "mpt"}, "fairring does not register mpt"),
        ({"FAIRRING_CHANNELS": "gdr"}, "unknown channel 'gdr'; expected a comma-separated list of basic, cuda_gdr"),
        ({"FAIRRING_CHANNELS": "^basic"}, "leaves no channel for CPU buffers"),
        ({"FAIRRING_CHANNELS": "^cuda_basic,cuda_gdr"}, "leaves no channel for CUDA buffers"),
        ({"FAIRRING_IB_GID_INDEX": "3"}, "'3' cannot be honoured: torch's TensorPipe always uses GID index 0"),
        ({"FAIRRING_IB_HCA": "mlx5_0:2"}, "port 2 of mlx5_0 cannot be used: torch's TensorPipe always uses port 1"),
        ({"FAIRRING_IB_HCA": "=mlx5_0:1,mlx5_1:2"}, "port 2 of mlx5_1 cannot be used"),
        ({"FAIRRING_IB_HCA": "mlx5_0:x"}, "'x' is not a port number"),
        ({"FAIRRING_IB_HCA": "mlx5_0:0"}, "'0' is not a port number"),
        ({"FAIRRING_IB_HCA": "mlx5_0,"}, "has an empty entry"),
        ({"FAIRRING_IB_HCA": "^"}, "has an empty entry"),
        ({"FAIRRING_IB_HCA": "=mlx5_0,=mlx5_1"}, "^ and = apply to the whole list and come first"),
        ({"FAIRRING_IB_DISABLE": "maybe"}, "FAIRRING_IB_DISABLE='maybe' is not a switch"),
        ({"FAIRRING_IB_DISABLE": "1", "FAIRRING_TRANSPORTS": "ibv"}, "'ibv' requires ibv, but FAIRRING_IB_DISABLE=1"),
        ({"FAIRRING_IB_DISABLE": "1", "FAIRRING_CHANNELS": "cuda_gdr"}, "requires cuda_gdr, but FAIRRING_IB_DISABLE=1"),
    ],
)  # fmt: skip
def test_bad_settings_name_the_variable_and_what_is_accepted(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        decision(env, host(IB0))
    assert message in str(error.value)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("raw", "selected"),
    [
        ("mlx5", {"mlx5_0", "mlx5_1", "mlx5_10"}),  # prefixes by default
        ("mlx5_1", {"mlx5_1", "mlx5_10"}),
        ("=mlx5_1", {"mlx5_1"}),
        ("=mlx5_0:1,mlx5_1:1", {"mlx5_0", "mlx5_1"}),
        ("^mlx5_1", {"mlx5_0", "bnxt_re0"}),
        ("^=mlx5_1", {"mlx5_0", "mlx5_10", "bnxt_re0"}),
        ("^mlx5_0:2", {"mlx5_0", "mlx5_1", "mlx5_10", "bnxt_re0"}),  # port 2 is never used anyway
        ("^=mlx5_0:1", {"mlx5_1", "mlx5_10", "bnxt_re0"}),
        ("bnxt, mlx5_10", {"bnxt_re0", "mlx5_10"}),
    ],
)
def test_ib_hca_selects_devices_like_nccl_ib_hca(raw: str, selected: set[str]) -> None:
    hca = parse_ib_hca(raw)
    assert hca is not None
    assert {name for name in ("mlx5_0", "mlx5_1", "mlx5_10", "bnxt_re0") if hca.selects(name)} == selected


# --- the decision table ------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_no_device_keeps_tcp_and_says_why() -> None:
    result = decision({}, host(sysfs="/sys/class/infiniband"))
    assert result.transports == ("uv",) and result.cpu_channels == ("basic",) and result.cuda_channels == ()
    assert result.reason("ibv") == "not used: no InfiniBand device (/sys/class/infiniband is empty or missing)"
    assert result.ib_device is None and result.required == frozenset()
    assert "rails transports uv; channels basic for CPU, none for CUDA buffers" in result.describe()
    assert " | ibv: not used: no InfiniBand device" in result.describe()


@pytest.mark.timeout(10)
def test_an_active_infiniband_device_gives_ibv_over_uv() -> None:
    result = decision({}, host(IB0, IB1))
    assert result.transports == ("ibv", "uv") and result.ib_device == "mlx5_0"
    assert "mlx5_0 port 1 (InfiniBand, ACTIVE), the first device libibverbs lists" in result.reason("ibv")
    assert result.reason("uv").startswith("registered: pipes connect over TCP first")


@pytest.mark.timeout(10)
def test_the_infiniband_machines_line_in_the_docs_is_what_the_code_writes() -> None:
    """No machine here has InfiniBand: deploying.md's line for one is the code's, fed a described machine
    (8 IPoIB interfaces, two ACTIVE HCAs), for rail 1 of machine 1 of 4."""
    env = {"FAIRRING_SOCKET_IFNAME": "ib"}
    addresses = [InterfaceAddress(f"ib{index}", "ipv4", f"10.{index}.0.9") for index in range(8)]
    interface = choose_rail_interface(load_config(env), 1, addresses)
    line = rails_line(9, 1, 4, 1, interface, decision(env, host(IB0, IB1)).describe())
    assert line.startswith("rank 9 (machine 1 of 4, rail 1): rails on ib1 10.1.0.9 ("), line
    assert_reads_as_documented(line, "docs/deploying.md", "rails on ib1")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("facts", "why"),
    [
        (host(device("mlx5_0", "DOWN"), IB1), "mlx5_0 port 1 is DOWN, not ACTIVE (TensorPipe's ibv transport opens"),
        (host(IbDevice("mlx5_0", (IbPort(2, "ACTIVE", "InfiniBand"),)), IB1), "mlx5_0 has no port 1"),
        (host(device("mlx5_0", "INIT")), "mlx5_0 port 1 is INIT, not ACTIVE"),
        (host(IB0, verbs_error="libibverbs.so.1 cannot be loaded (x)"), "libibverbs.so.1 cannot be loaded (x)"),
        (host(unlisted=("mlx5_0",)), "libibverbs lists no device, though /sys/class/infiniband has mlx5_0: no"),
        (host(IB0, fork=ForkFacts(present=())), "not fork-safe: neither RDMAV_FORK_SAFE nor IBV_FORK_SAFE is set"),
        (host(IB0, fork=ForkFacts(preloaded=True)), "not fork-safe: libibverbs.so.1 was loaded before fairring set"),
        (host(IB0, fork=ForkFacts(status="disabled")), "not fork-safe: libibverbs reports fork protection off"),
    ],
)  # fmt: skip
def test_ibv_stays_off_with_the_reason_and_is_an_error_where_required(facts: HostFacts, why: str) -> None:
    result = decision({}, facts)
    assert result.transports == ("uv",) and result.ib_device is None
    assert why in result.reason("ibv")
    with pytest.raises(ConfigError) as error:
        decision({"FAIRRING_TRANSPORTS": "ibv"}, facts)
    assert f"FAIRRING_TRANSPORTS='ibv' requires ibv, but the rails cannot use it here: {why}" in str(error.value)


@pytest.mark.timeout(10)
def test_fork_problems_say_how_to_fix_them() -> None:
    result = decision({}, host(IB0, fork=ForkFacts(preloaded=True)))
    assert "import fairring before anything that loads libibverbs, or export RDMAV_FORK_SAFE=1" in result.reason("ibv")
    assert result.reason("fork safety") == result.reason("ibv").removeprefix("not used: ")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"FAIRRING_IB_DISABLE": "1"}, "FAIRRING_IB_DISABLE=1"),
        ({"FAIRRING_TRANSPORTS": "uv"}, "FAIRRING_TRANSPORTS='uv' does not list it"),
        ({"FAIRRING_TRANSPORTS": "^ibv"}, "excluded by FAIRRING_TRANSPORTS='^ibv'"),
    ],
)
def test_settings_keep_the_rails_on_tcp(env: dict[str, str], why: str) -> None:
    result = decision(env, host(IB0, IB1, **GDR_HOST), cuda=True)
    assert result.transports == ("uv",) and result.reason("ibv") == f"not used: {why}"
    assert result.reason("uv") == "used: TCP"
    if "FAIRRING_IB_DISABLE" in env:  # it also forbids GPUDirect RDMA
        assert result.cuda_channels == ("cuda_basic",) and result.reason("cuda_gdr") == f"not used: {why}"
    else:
        assert result.cuda_channels == ("cuda_gdr", "cuda_basic")
    assert not needs_infiniband(load_transport_settings(env), cuda=False)


@pytest.mark.timeout(10)
def test_listed_transports_are_required_and_uv_stays_for_bootstrap() -> None:
    result = decision({"FAIRRING_TRANSPORTS": "ibv"}, host(IB0))
    assert result.transports == ("ibv", "uv") and result.required == {"ibv"}
    assert decision({"FAIRRING_TRANSPORTS": "uv,ibv"}, host(IB0)).transports == ("ibv", "uv")  # priority is fixed
    assert decision({"FAIRRING_TRANSPORTS": "uv"}, host(IB0)).required == {"uv"}


@pytest.mark.timeout(10)
def test_roce_is_used_only_when_asked_for() -> None:
    roce = host(device("mlx5_0", link="Ethernet"))
    assert decision({}, roce).transports == ("uv",)
    listed = decision({"FAIRRING_TRANSPORTS": "ibv"}, roce)
    assert listed.transports == ("ibv", "uv") and "(RoCE, ACTIVE)" in listed.reason("ibv")
    assert decision({"FAIRRING_IB_HCA": "mlx5_0"}, roce).transports == ("ibv", "uv")
    roce_gpus = host(device("mlx5_0", link="Ethernet"), **GDR_HOST)
    automatic = decision({}, roce_gpus, cuda=True)
    assert automatic.cuda_channels == ("cuda_basic",)
    assert "no usable device: mlx5_0 port 1 is RoCE" in automatic.reason("cuda_gdr")
    assert decision({"FAIRRING_CHANNELS": "cuda_gdr"}, roce_gpus, cuda=True).gdr_nics == ("mlx5_0", "mlx5_0")


def test_efa_is_never_tensorpipes() -> None:
    """EFA has SRD queue pairs, not the reliable-connected ones TensorPipe's ibv and cuda_gdr create: fairring
    refuses it itself, naming the two ways on, rather than leaving TensorPipe to fail on it."""
    efa = host(device("efa_0", link="Unspecified"), **GDR_HOST)
    automatic = decision({}, efa, cuda=True)
    assert automatic.transports == ("uv",) and automatic.cuda_channels == ("cuda_basic",)
    why = "efa_0 is an AWS EFA device, which has no reliable-connected queue pairs"
    assert why in automatic.reason("ibv") and why in automatic.reason("cuda_gdr")
    for asked in ({"FAIRRING_TRANSPORTS": "ibv"}, {"FAIRRING_IB_HCA": "efa_0", "FAIRRING_TRANSPORTS": "ibv"}):
        with pytest.raises(ConfigError, match=r"FAIRRING_IB_DISABLE=1.*FAIRRING_RAILS_TRANSPORT=nixl"):
            decision(asked, efa)
    # Negative control: an InfiniBand HCA in its place is used.
    assert decision({}, host(IB0)).transports == ("ibv", "uv")


@pytest.mark.timeout(10)
def test_ibv_follows_ib_hca_only_through_the_first_device() -> None:
    both = host(IB0, IB1, **GDR_HOST)
    first = decision({"FAIRRING_IB_HCA": "=mlx5_0"}, both, cuda=True)
    assert first.transports == ("ibv", "uv") and first.gdr_nics == ("mlx5_0", "mlx5_0")
    assert first.reason("FAIRRING_IB_HCA") == "selects mlx5_0 (port 1)"

    # TensorPipe's ibv opens mlx5_0 whatever we ask; cuda_gdr can still use mlx5_1.
    second = decision({"FAIRRING_IB_HCA": "mlx5_1"}, both, cuda=True)
    assert second.transports == ("uv",) and second.ib_device is None
    assert "opens only the first device libibverbs lists, mlx5_0, which FAIRRING_IB_HCA='mlx5_1' does not select" in (
        second.reason("ibv")
    )
    assert second.cuda_channels == ("cuda_gdr", "cuda_basic") and second.gdr_nics == ("mlx5_1", "mlx5_1")
    with pytest.raises(ConfigError, match="requires ibv, but the rails cannot use it here: TensorPipe's ibv"):
        decision({"FAIRRING_IB_HCA": "^mlx5_0", "FAIRRING_TRANSPORTS": "ibv"}, both)


@pytest.mark.timeout(10)
def test_ib_hca_that_matches_nothing_lists_the_devices() -> None:
    facts = host(IB0, device("mlx5_1", "DOWN", "Ethernet"), unlisted=("qedr0",))
    with pytest.raises(ConfigError) as error:
        decision({"FAIRRING_IB_HCA": "=mlx5"}, facts)
    assert str(error.value) == (
        "FAIRRING_IB_HCA='=mlx5' selects no InfiniBand device of this machine; its devices: "
        "mlx5_0 (port 1 ACTIVE InfiniBand); mlx5_1 (port 1 DOWN RoCE); qedr0 (no userspace driver)"
    )
    with pytest.raises(ConfigError, match=r"its devices: none \(/sys/class/infiniband is empty or missing\)"):
        decision({"FAIRRING_IB_HCA": "mlx5"}, host())
    # Not an error where the rails use no InfiniBand anyway.
    unused = decision({"FAIRRING_IB_HCA": "=mlx5", "FAIRRING_IB_DISABLE": "1"}, facts)
    assert unused.reason("FAIRRING_IB_HCA") == "not used: the rails use no InfiniBand"


# --- CUDA channels -----------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_gpudirect_lets_tensorpipe_pick_nics_when_every_device_is_usable() -> None:
    facts = host(device("mlx5_0", pci=f"{PCI_ROOT}/a"), device("mlx5_1", pci=f"{PCI_ROOT}/b"), **GDR_HOST)
    result = decision({}, facts, cuda=True)
    assert result.cuda_channels == ("cuda_gdr", "cuda_basic") and result.gdr_nics is None
    assert "TensorPipe maps each GPU to its PCI-nearest device of mlx5_0, mlx5_1" in result.reason("cuda_gdr")
    assert result.reason("cuda_basic").endswith("the fallback to peers without cuda_gdr")


@pytest.mark.timeout(10)
def test_gpudirect_maps_gpus_itself_where_tensorpipe_could_pick_a_bad_device() -> None:
    # TensorPipe's own choice ignores port state: mlx5_1 is DOWN, so map to mlx5_0 and mlx5_2 only.
    devices = (device("mlx5_0"), device("mlx5_1", "DOWN"), device("mlx5_2"))
    result = decision({}, host(*devices, gpus=3, peer_memory="nv_mem"), cuda=True)
    assert result.gdr_nics == ("mlx5_0", "mlx5_2", "mlx5_0")
    assert "GPU 0 -> mlx5_0, GPU 1 -> mlx5_2, GPU 2 -> mlx5_0 (round-robin: PCI paths unknown)" in result.reason(
        "cuda_gdr"
    )


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("facts", "why"),
    [
        (host(IB0, gpus=2), "no GPU peer-memory client in /sys/kernel/mm/memory_peers: GPUDirect RDMA needs"),
        (host(IB0, gpus=2, peer_memory_modules=("nvidia_peermem",)), "nvidia_peermem is loaded but registered no"),
        (host(device("mlx5_0", "DOWN"), **GDR_HOST), "no usable device: mlx5_0 port 1 is DOWN, not ACTIVE"),
        (host(**GDR_HOST), "no InfiniBand device"),
        (host(IB0, peer_memory="nv_mem"), "this process sees no CUDA device"),
        (host(IB0, **GDR_HOST, fork=ForkFacts(present=())), "not fork-safe"),
    ],
)  # fmt: skip
def test_gpudirect_stays_off_with_the_reason_and_is_an_error_where_required(facts: HostFacts, why: str) -> None:
    result = decision({}, facts, cuda=True)
    assert result.cuda_channels == ("cuda_basic",) and result.gdr_nics is None
    assert why in result.reason("cuda_gdr")
    with pytest.raises(ConfigError, match="FAIRRING_CHANNELS='cuda_gdr' requires cuda_gdr, but the rails cannot"):
        decision({"FAIRRING_CHANNELS": "cuda_gdr"}, facts, cuda=True)
    with pytest.raises(ConfigError, match="leaves CUDA buffers only cuda_gdr, which cannot be used here"):
        decision({"FAIRRING_CHANNELS": "^cuda_basic"}, facts, cuda=True)


@pytest.mark.timeout(10)
def test_channel_lists_restrict_only_the_buffer_kinds_they_name() -> None:
    facts = host(IB0, **GDR_HOST)
    gdr_only = decision({"FAIRRING_CHANNELS": "cuda_gdr"}, facts, cuda=True)
    assert gdr_only.cpu_channels == ("basic",) and gdr_only.cuda_channels == ("cuda_gdr",)
    assert gdr_only.required == {"cuda_gdr"}
    assert gdr_only.reason("cuda_basic") == "not used: FAIRRING_CHANNELS='cuda_gdr' does not list it"
    staged = decision({"FAIRRING_CHANNELS": "cuda_basic"}, facts, cuda=True)
    assert staged.cuda_channels == ("cuda_basic",) and staged.transports == ("ibv", "uv")
    assert decision({"FAIRRING_CHANNELS": "^cuda_gdr"}, facts, cuda=True).cuda_channels == ("cuda_basic",)


@pytest.mark.timeout(10)
def test_cuda_channels_are_not_required_of_a_process_without_cuda_buffers() -> None:
    result = decision({"FAIRRING_CHANNELS": "cuda_gdr,basic"}, host(), cuda=False)
    assert result.cuda_channels == () and result.required == {"basic"}
    assert result.reason("cuda") == "no CUDA channel: this process's rails move no CUDA buffers"


@pytest.mark.timeout(10)
def test_gpus_go_to_the_nearest_nic_by_pci_path_with_ties_spread() -> None:
    switch_a, switch_b = f"{PCI_ROOT}/0000:00:01.0/0000:01:00.0", f"{PCI_ROOT}/0000:00:02.0/0000:02:00.0"
    nics = (
        IbDevice("mlx5_0", pci_path=f"{switch_a}/0000:03:00.0"),
        IbDevice("mlx5_1", pci_path=f"{switch_b}/0000:04:00.0"),
    )
    gpus = (f"{switch_b}/0000:05:00.0", f"{switch_a}/0000:06:00.0", f"{switch_b}/0000:07:00.0", f"{PCI_ROOT}/x")
    nearest, rule = map_gpus_to_nics(gpus, nics)
    # GPU 3 shares only the root with both: the one with fewer GPUs so far (mlx5_0) gets it.
    assert nearest == ("mlx5_1", "mlx5_0", "mlx5_1", "mlx5_0") and rule == "nearest by PCI path"
    assert map_gpus_to_nics((f"{switch_a}/g", None), nics) == (("mlx5_0", "mlx5_1"), "round-robin: PCI paths unknown")


@pytest.mark.timeout(10)
def test_ib_hca_maps_gpus_to_the_selected_devices_by_pci_path() -> None:
    facts = host(
        device("mlx5_0", pci=f"{PCI_ROOT}/0000:00:01.0/nic0"),
        device("mlx5_1", pci=f"{PCI_ROOT}/0000:00:02.0/nic1"),
        device("mlx5_2", pci=f"{PCI_ROOT}/0000:00:02.0/nic2"),
        gpus=(f"{PCI_ROOT}/0000:00:01.0/gpu0", f"{PCI_ROOT}/0000:00:02.0/gpu1"),
        peer_memory="nvidia-peermem",
    )
    result = decision({"FAIRRING_IB_HCA": "^=mlx5_0"}, facts, cuda=True)
    assert result.gdr_nics == ("mlx5_1", "mlx5_2")  # GPU 0's own switch has only the excluded mlx5_0
    assert "(nearest by PCI path)" in result.reason("cuda_gdr")


# --- fork safety -------------------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("fork", "safe", "text"),
    [
        (ForkFacts(), True, "safe: RDMAV_FORK_SAFE and IBV_FORK_SAFE set before libibverbs initialises"),
        (ForkFacts(status="enabled"), True, "safe: libibverbs' fork protection is on"),
        # A kernel that copies pinned pages on fork makes the rest moot.
        (ForkFacts(present=(), preloaded=True, status="unneeded"), True, "ibv_is_fork_initialized: UNNEEDED"),
        (ForkFacts(preloaded=True, status="enabled"), True, "fork protection is on"),
        (ForkFacts(present=()), False, "neither RDMAV_FORK_SAFE nor IBV_FORK_SAFE is set"),
        (ForkFacts(preloaded=True), False, "was loaded before fairring set RDMAV_FORK_SAFE"),
        (ForkFacts(preloaded=True, status="disabled"), False, "was loaded before fairring set RDMAV_FORK_SAFE"),
        (ForkFacts(status="disabled"), False, "libibverbs reports fork protection off"),
        (
            ForkFacts(user_values=(("RDMAV_FORK_SAFE", "0"),)),
            True,
            "(RDMAV_FORK_SAFE='0' does not turn it off: libibverbs enables it whenever the variable exists)",
        ),
    ],
)
def test_fork_verdict(fork: ForkFacts, safe: bool, text: str) -> None:
    verdict, why = fork_verdict(fork)
    assert verdict is safe and text in why


@pytest.mark.timeout(10)
def test_fork_facts_count_a_preloaded_libibverbs_only_where_fairring_set_the_variables() -> None:
    environ = {"RDMAV_FORK_SAFE": "1", "IBV_FORK_SAFE": "1"}
    by_fairring = fork_facts(ImportState(ibverbs_loaded=True), environ, None)
    assert by_fairring.preloaded and by_fairring.present == ("RDMAV_FORK_SAFE", "IBV_FORK_SAFE")
    by_user = fork_facts(ImportState((("RDMAV_FORK_SAFE", "1"),), ibverbs_loaded=True), environ, None)
    assert not by_user.preloaded and by_user.user_values == (("RDMAV_FORK_SAFE", "1"),)
    assert fork_facts(ImportState(), {}, "disabled") == ForkFacts(present=(), status="disabled")


@pytest.mark.timeout(10)
def test_ibverbs_mapped_reads_proc_maps() -> None:
    maps = (
        "7f00-7f01 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f02-7f03 rw-p 00000000 00:00 0 \n"
        "7f04-7f05 r--p 00000000 08:01 456 /usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.50.0\n"
    )
    assert ibverbs_mapped(maps)
    assert not ibverbs_mapped(maps.replace("libibverbs", "libverbs_not"))
    assert not ibverbs_mapped("7f00-7f01 r-xp 00000000 08:01 1 /opt/libibverbs.so.1/other.so\n")


@pytest.mark.timeout(10)
def test_read_import_state(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f04-7f05 r--p 00000000 08:01 456 /usr/lib/libibverbs.so.1\n")
    state = read_import_state({"IBV_FORK_SAFE": "0", "PATH": "/bin"}, str(maps))
    assert state == ImportState((("IBV_FORK_SAFE", "0"),), ibverbs_loaded=True)
    assert read_import_state({}, str(tmp_path / "missing")) == ImportState()


# --- discovery ---------------------------------------------------------------------------------------


def add_device(root: Path, name: str, ports: Mapping[int, tuple[str, str]], pci: str | None = None) -> None:
    """A device as sysfs shows it under /sys/class/infiniband, with a link to its PCI device."""
    folder = root / "sys/class/infiniband" / name
    for number, (state, link) in ports.items():
        port = folder / "ports" / str(number)
        port.mkdir(parents=True)
        (port / "state").write_text(f"{STATE_CODES[state]}: {state}\n")
        (port / "link_layer").write_text(f"{link}\n")
    if pci is not None:
        target = root / "sys/devices" / pci
        target.mkdir(parents=True, exist_ok=True)
        (folder / "device").symlink_to(target)


def add_gpu(root: Path, bus_id: str, pci: str) -> None:
    target = root / "sys/devices" / pci
    target.mkdir(parents=True, exist_ok=True)
    (root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    (root / "sys/bus/pci/devices" / bus_id).symlink_to(target)


@pytest.mark.timeout(10)
def test_probe_host_reads_a_sysfs_tree_in_libibverbs_order(tmp_path: Path) -> None:
    add_device(
        tmp_path, "mlx5_0", {1: ("ACTIVE", "InfiniBand"), 2: ("DOWN", "Ethernet")}, "pci0000:00/0000:00:01.0/nic0"
    )
    add_device(tmp_path, "mlx5_1", {1: ("ARMED", "InfiniBand")}, "pci0000:00/0000:00:02.0/nic1")
    add_device(tmp_path, "rxe0", {1: ("ACTIVE", "Ethernet")})  # virtual: no PCI device
    add_gpu(tmp_path, "0000:3b:00.0", "pci0000:00/0000:00:02.0/gpu0")
    (tmp_path / "sys/kernel/mm/memory_peers/nvidia-peermem").mkdir(parents=True)
    (tmp_path / "sys/kernel/mm/memory_peers/nvidia-peermem/version").write_text("1.2\n")
    (tmp_path / "sys/module/nvidia_peermem").mkdir(parents=True)
    probe = VerbsProbe(names=("mlx5_1", "mlx5_0"), fork_status="enabled")  # rxe0: no provider

    facts = probe_host(tmp_path, ["0000:3B:00.0", "0000:af:00.0"], lambda: probe, ImportState(), {"IBV_FORK_SAFE": "1"})
    assert [d.name for d in facts.devices] == ["mlx5_1", "mlx5_0"] and facts.unlisted == ("rxe0",)
    mlx5_0 = facts.devices[1]
    assert mlx5_0.ports == (IbPort(1, "ACTIVE", "InfiniBand"), IbPort(2, "DOWN", "Ethernet"))
    assert mlx5_0.pci_path == os.path.realpath(tmp_path / "sys/devices/pci0000:00/0000:00:01.0/nic0")
    assert facts.devices[0].port(1) == IbPort(1, "ARMED", "InfiniBand")
    assert facts.gpus == (os.path.realpath(tmp_path / "sys/devices/pci0000:00/0000:00:02.0/gpu0"), None)
    assert facts.peer_memory == "nvidia-peermem" and facts.peer_memory_modules == ("nvidia_peermem",)
    assert facts.fork == ForkFacts(present=("IBV_FORK_SAFE",), status="enabled") and facts.verbs_error is None

    # mlx5_1 comes first in libibverbs' order and is not ACTIVE: TensorPipe's ibv would open it.
    result = decide(load_transport_settings({}), facts, cuda=False)
    assert result.transports == ("uv",) and "mlx5_1 port 1 is ARMED, not ACTIVE" in result.reason("ibv")


@pytest.mark.timeout(10)
def test_probe_host_asks_libibverbs_only_where_sysfs_shows_devices(tmp_path: Path) -> None:
    def no_call() -> VerbsProbe:
        raise AssertionError("libibverbs must not be loaded without devices")

    empty = probe_host(tmp_path, verbs=no_call, import_state=ImportState(), environ={})
    assert empty.devices == () and empty.verbs_error is None
    assert empty.sysfs == str(tmp_path / "sys/class/infiniband")

    add_device(tmp_path, "mlx5_1", {1: ("ACTIVE", "InfiniBand")})
    add_device(tmp_path, "mlx5_0", {1: ("ACTIVE", "InfiniBand")})
    failed = probe_host(tmp_path, verbs=lambda: VerbsProbe(error="libibverbs.so.1 cannot be loaded (x)"))
    assert [d.name for d in failed.devices] == ["mlx5_0", "mlx5_1"]  # sysfs order where libibverbs cannot list
    assert failed.verbs_error == "libibverbs.so.1 cannot be loaded (x)"
    skipped = probe_host(tmp_path, verbs=None)
    assert skipped.verbs_error == "libibverbs.so.1 was not probed"


@pytest.mark.timeout(60)
def test_rails_transports_on_this_machine() -> None:
    result = rails_transports(load_transport_settings({}), cuda=False)
    assert result.transports[-1] == "uv" and result.cpu_channels == ("basic",)
    if not Path("/sys/class/infiniband").is_dir():
        assert result.transports == ("uv",) and "no InfiniBand device" in result.reason("ibv")
    with pytest.raises(ConfigError, match="FAIRRING_TRANSPORTS='shm'"):
        rails_transports(load_transport_settings({"FAIRRING_TRANSPORTS": "shm"}), cuda=False)


def test_nccl_ib_hca_alone_never_makes_a_roce_port_acceptable() -> None:
    """NCCL_IB_HCA chose devices for NCCL, which can set their GID; TensorPipe's rails use GID 0, hop limit 1."""
    roce = host(device("mlx5_0", link="Ethernet"))
    assert decision({"NCCL_IB_HCA": "mlx5_0"}, roce).transports == ("uv",)
    assert decision({"FAIRRING_IB_HCA": "mlx5_0", "NCCL_IB_HCA": "mlx5_0"}, roce).transports == ("ibv", "uv")
    # On InfiniBand it selects the rails' device as it does NCCL's.
    chosen = decision({"NCCL_IB_HCA": "=mlx5_0"}, host(IB0, IB1))
    assert chosen.transports == ("ibv", "uv") and chosen.reason("NCCL_IB_HCA") == "selects mlx5_0 (port 1)"
    assert decision({"NCCL_IB_HCA": "=mlx5_1"}, host(IB0, IB1)).transports == ("uv",)
