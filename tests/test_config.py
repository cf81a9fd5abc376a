"""Environment parsing (fairring/_config.py): every variable, its defaults and errors, and what an NCCL job
already sets. No processes, no sockets."""

from __future__ import annotations

import dataclasses

import pytest

from fairring import _C
from fairring._config import (
    DEFAULT_AUTO_BUDGET_S,
    DEFAULT_CPU_FLAT_THRESHOLD,
    DEFAULT_CUDA_FLAT_THRESHOLD,
    DEFAULT_MIN_SHARD_SIZE,
    DEFAULT_SLICE_SIZE,
    DEFAULT_SLICES_IN_FLIGHT,
    DEFAULT_TOTAL_MEMORY,
    MEASURED_THRESHOLD,
    Config,
    ConfigError,
    load_config,
    load_transport_settings,
)


def test_defaults() -> None:
    config = load_config({})
    assert config.total_memory == DEFAULT_TOTAL_MEMORY == 50 * 2**20
    assert config.slice_size == DEFAULT_SLICE_SIZE == 4 * 2**20
    assert config.flat_threshold is None  # by device type:
    assert config.cpu_flat_threshold == DEFAULT_CPU_FLAT_THRESHOLD == 0
    assert config.cuda_flat_threshold == DEFAULT_CUDA_FLAT_THRESHOLD == 16 * 2**20
    assert config.min_shard == DEFAULT_MIN_SHARD_SIZE == 256 * 2**10
    assert config.slices_in_flight == DEFAULT_SLICES_IN_FLIGHT == 4
    assert config.shm_disable is False
    assert "FAIRRING_FLAT_THRESHOLD=(CPU 0B, CUDA 16MiB)" in config.describe()
    assert config.machine_id is None and config.log_level is None
    assert config.cuda_engine is False and config.ib_disable is False
    assert config.rails_transport == "tensorpipe" and config.nixl_backend == "UCX"
    assert "FAIRRING_RAILS_TRANSPORT=tensorpipe" in config.describe() and "NIXL" not in config.describe()


def test_rails_transport_and_nixl_backend_are_case_insensitive_and_must_agree() -> None:
    config = load_config({"FAIRRING_RAILS_TRANSPORT": " NIXL ", "FAIRRING_NIXL_BACKEND": "libfabric"})
    assert (config.rails_transport, config.nixl_backend) == ("nixl", "LIBFABRIC")
    assert "FAIRRING_NIXL_BACKEND=LIBFABRIC" in config.describe()
    agreed = config.must_agree()
    assert agreed["FAIRRING_RAILS_TRANSPORT"] == "nixl" and agreed["FAIRRING_NIXL_BACKEND"] == "LIBFABRIC"
    # The backend only matters on NIXL: ranks on TensorPipe need not agree on it.
    tensorpipe = load_config({"FAIRRING_NIXL_BACKEND": "LIBFABRIC"}).must_agree()
    assert tensorpipe["FAIRRING_NIXL_BACKEND"] == load_config({}).must_agree()["FAIRRING_NIXL_BACKEND"]


def test_values_from_environment() -> None:
    config = load_config(
        {
            "FAIRRING_TOTAL_MEMORY": "1GiB",
            "FAIRRING_SLICE_SIZE": "4M",
            "FAIRRING_FLAT_THRESHOLD": "1MiB",
            "FAIRRING_MACHINE_ID": " rack3-node7 ",
            "FAIRRING_LOG_LEVEL": "debug",
            "FAIRRING_CUDA_ENGINE": "1",
            "FAIRRING_MIN_SHARD_SIZE": "64KiB",
            "FAIRRING_SLICES_IN_FLIGHT": " 2 ",
        }
    )
    assert config.slices_in_flight == 2
    assert config.cpu_flat_threshold == config.cuda_flat_threshold == 2**20
    assert (config.total_memory, config.slice_size) == (2**30, 4 * 2**20)
    assert config.machine_id == "rack3-node7"
    assert config.log_level == "DEBUG"
    assert config.must_agree() == {
        "fairring.Options.engine": "unset",
        "FAIRRING_ENGINE_DISABLE": 0,
        "FAIRRING_TOTAL_MEMORY": 2**30,
        "FAIRRING_SLICE_SIZE": 4 * 2**20,
        "FAIRRING_MIN_SHARD_SIZE": 64 * 2**10,
        "FAIRRING_FLAT_THRESHOLD": 2**20,
        "FAIRRING_CPU_FLAT_THRESHOLD": "unset",
        "FAIRRING_CUDA_FLAT_THRESHOLD": "unset",
        "FAIRRING_CUDA_ENGINE": 1,
        "FAIRRING_RAILS_TRANSPORT": "tensorpipe",
        "FAIRRING_RAIL_FAILOVER": 0,
        "FAIRRING_NIXL_BACKEND": "unused",
        "FAIRRING_SERIALIZED_LAUNCHES": "engine",
        "FAIRRING_RAILS_SECRET": 0,
        "FAIRRING_RAILS_ENCRYPT": 0,
    }
    assert "FAIRRING_SLICE_SIZE=4MiB" in config.describe()
    assert "FAIRRING_CUDA_ENGINE=1" in config.describe()
    assert "FAIRRING_SLICES_IN_FLIGHT=2" in config.describe()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        *[("1", True), ("true", True), (" Yes ", True), ("ON", True)],
        *[("0", False), ("false", False), ("off", False), ("", False)],
    ],
)
def test_switches(raw: str, expected: bool) -> None:
    assert load_config({"FAIRRING_CUDA_ENGINE": raw}).cuda_engine is expected
    assert load_config({"FAIRRING_IB_DISABLE": raw}).ib_disable is expected
    assert load_config({"FAIRRING_SHM_DISABLE": raw}).shm_disable is expected


def test_flat_threshold_may_be_zero_but_not_negative() -> None:
    assert load_config({"FAIRRING_FLAT_THRESHOLD": "0"}).flat_threshold == 0
    assert load_config({"FAIRRING_MIN_SHARD_SIZE": "0"}).min_shard == 0  # no floor
    with pytest.raises(ConfigError, match="FAIRRING_FLAT_THRESHOLD='-1'"):
        load_config({"FAIRRING_FLAT_THRESHOLD": "-1"})


def test_auto_thresholds_are_measured_where_asked_and_explicit_values_win() -> None:
    auto = load_config({"FAIRRING_FLAT_THRESHOLD": "Auto"})
    assert auto.cpu_flat_threshold == auto.cuda_flat_threshold == MEASURED_THRESHOLD
    assert "FAIRRING_FLAT_THRESHOLD=auto" in auto.describe() and auto.must_agree()["FAIRRING_FLAT_THRESHOLD"] == "auto"
    # FAIRRING_CUDA_ENGINE=auto: the engine on, measured against NCCL; CPU keeps its default ...
    cuda = load_config({"FAIRRING_CUDA_ENGINE": "auto"})
    assert cuda.cuda_engine and cuda.cuda_flat_threshold == MEASURED_THRESHOLD and cuda.cpu_flat_threshold == 0
    assert cuda.must_agree()["FAIRRING_CUDA_ENGINE"] == "auto"
    # ... unless a threshold is given, which wins.
    pinned = load_config({"FAIRRING_CUDA_ENGINE": "auto", "FAIRRING_FLAT_THRESHOLD": "8MiB"})
    assert pinned.cuda_engine and pinned.cuda_flat_threshold == 8 * 2**20
    native = _C.Config.from_settings(auto)
    assert native.cpu_flat_threshold_bytes == native.cuda_flat_threshold_bytes == MEASURED_THRESHOLD
    # A group's own threshold wins over the variable.
    assert auto.with_group_options(None, 4096).cpu_flat_threshold == 4096


def test_the_measurements_limit_and_cache() -> None:
    assert load_config({}).auto_budget_s == DEFAULT_AUTO_BUDGET_S
    assert load_config({"FAIRRING_AUTO_BUDGET": "2.5s"}).auto_budget_s == 2.5
    assert load_config({"XDG_CACHE_HOME": "/x"}).auto_cache == "/x/fairring"
    assert load_config({"FAIRRING_AUTO_CACHE": "off"}).auto_cache is None
    # A flag's words for off are off, not a folder named "false" in the working directory.
    for off in ("false", "no", "0", "FALSE"):
        assert load_config({"FAIRRING_AUTO_CACHE": off}).auto_cache is None, off
    # Empty is unset, as for every variable; WARN is NCCL_DEBUG's spelling.
    assert load_config({"FAIRRING_LOG_LEVEL": ""}).log_level is None
    assert load_config({"FAIRRING_LOG_LEVEL": "warn"}).log_level == "WARNING"
    # The machine's memory in a unit a reader reads at a glance ("23.5 GiB"), not a count of KiB.
    with pytest.raises(ConfigError, match=r"than this machine's memory \(\d+(\.\d+)? GiB\)"):
        load_config({"FAIRRING_TOTAL_MEMORY": "1024TiB"})
    # The variables that take auto say so when refusing a value.
    for name in ("FAIRRING_CUDA_ENGINE", "FAIRRING_FLAT_THRESHOLD", "FAIRRING_CUDA_FLAT_THRESHOLD"):
        with pytest.raises(ConfigError, match=f"{name}='maybe' .*; or auto: "):
            load_config({name: "maybe"})
    assert load_config({"FAIRRING_AUTO_CACHE": "/tmp/c"}).auto_cache == "/tmp/c"


def test_empty_size_variable_means_default() -> None:
    assert load_config({"FAIRRING_SLICE_SIZE": " "}).slice_size == DEFAULT_SLICE_SIZE


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"FAIRRING_MACHINE_ID": "  "}, "FAIRRING_MACHINE_ID is set but empty"),
        ({"FAIRRING_LOG_LEVEL": "chatty"}, "FAIRRING_LOG_LEVEL='chatty' is not a log level"),
        ({"FAIRRING_TOTAL_MEMORY": "lots"}, "FAIRRING_TOTAL_MEMORY='lots' is not a size"),
        ({"FAIRRING_CUDA_ENGINE": "maybe"}, "FAIRRING_CUDA_ENGINE='maybe' is not a switch; use 1, true"),
        # Every size variable: invalid, negative, zero, absurdly large or small.
        ({"FAIRRING_TOTAL_MEMORY": "-1MiB"}, "FAIRRING_TOTAL_MEMORY='-1MiB' is not a size"),
        ({"FAIRRING_TOTAL_MEMORY": "0"}, "FAIRRING_TOTAL_MEMORY='0' must be larger than zero"),
        ({"FAIRRING_TOTAL_MEMORY": "1024TiB"}, "FAIRRING_TOTAL_MEMORY='1024TiB' is more than this machine's memory"),
        ({"FAIRRING_TOTAL_MEMORY": "1.5B"}, "FAIRRING_TOTAL_MEMORY='1.5B' is not a whole number of bytes"),
        ({"FAIRRING_SLICE_SIZE": "0"}, "FAIRRING_SLICE_SIZE='0' must be larger than zero"),
        ({"FAIRRING_SLICE_SIZE": "-4M"}, "FAIRRING_SLICE_SIZE='-4M' is not a size"),
        ({"FAIRRING_SLICE_SIZE": "1"}, "FAIRRING_SLICE_SIZE='1' is below the smallest slice, 4KiB"),
        ({"FAIRRING_SLICE_SIZE": "4 parsecs"}, "FAIRRING_SLICE_SIZE='4 parsecs' is not a size"),
        ({"FAIRRING_FLAT_THRESHOLD": "-1"}, "FAIRRING_FLAT_THRESHOLD='-1' is not a size"),
        ({"FAIRRING_FLAT_THRESHOLD": "1e6"}, "FAIRRING_FLAT_THRESHOLD='1e6' is not a size"),
        ({"FAIRRING_AUTO_BUDGET": "0"}, "FAIRRING_AUTO_BUDGET='0' is not a time; give seconds above 0"),
        ({"FAIRRING_AUTO_BUDGET": "soon"}, "FAIRRING_AUTO_BUDGET='soon' is not a time"),
        ({"FAIRRING_AUTO_BUDGET": "inf"}, "FAIRRING_AUTO_BUDGET='inf' is not a time"),
        *[
            ({"FAIRRING_SLICES_IN_FLIGHT": raw}, f"FAIRRING_SLICES_IN_FLIGHT='{raw}' is not a count; use a whole")
            for raw in ("0", "-2", "2.5", "many")
        ],
        # Switches, names and folders.
        ({"FAIRRING_IB_DISABLE": "2"}, "FAIRRING_IB_DISABLE='2' is not a switch"),
        ({"FAIRRING_SOCKET_IFNAME": "^"}, "names no interface; give comma-separated"),
        ({"FAIRRING_SOCKET_IFNAME": "eth0,^lo"}, "lo' cannot be an interface name"),
        ({"TP_SOCKET_IFNAME": "a-very-long-interface"}, "'a-very-long-interface' cannot be an interface name"),
        ({"FAIRRING_SOCKET_FAMILY": "AF_UNIX"}, "FAIRRING_SOCKET_FAMILY='AF_UNIX' is not an address family"),
        ({"FAIRRING_RAIL_INTERFACES": "^eth0"}, "list the interface of each rail in order"),
        ({"FAIRRING_TIMELINE": "/proc/fairring-timeline"}, "FAIRRING_TIMELINE='/proc/fairring-timeline': cannot"),
        ({"FAIRRING_RAILS_TRANSPORT": "ucx"}, "FAIRRING_RAILS_TRANSPORT='ucx' is not one of tensorpipe, nixl"),
        ({"FAIRRING_NIXL_BACKEND": "EFA"}, "FAIRRING_NIXL_BACKEND='EFA' is not one of UCX, LIBFABRIC"),
    ],
)
def test_invalid_environment(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        load_config(env)


# --- what an NCCL job already sets ----------------------------------------------------------------


def test_the_rails_follow_nccl_socket_ifname_after_fairrings_own_variables() -> None:
    nccl_only = load_config({"NCCL_SOCKET_IFNAME": "^docker,lo"})
    assert nccl_only.socket_ifname_variable == "NCCL_SOCKET_IFNAME"
    assert nccl_only.socket_ifname is not None and nccl_only.socket_ifname.exclude
    assert not nccl_only.socket_ifname.matches("docker0") and nccl_only.socket_ifname.matches("eth0")
    for own in ("FAIRRING_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        config = load_config({own: "eth1", "NCCL_SOCKET_IFNAME": "ib0"})
        assert config.socket_ifname_variable == own
        assert config.socket_ifname is not None and config.socket_ifname.matches("eth1")
    assert load_config({}).socket_ifname is None


def test_a_cpu_jobs_rails_follow_gloo_socket_ifname() -> None:
    # A CPU job sets Gloo's variable (exact names, comma-separated); the rails replace Gloo's all-reduces.
    both = {"GLOO_SOCKET_IFNAME": "eth1,eth2", "NCCL_SOCKET_IFNAME": "ib"}
    cpu = load_config(both)
    assert cpu.socket_ifname_variable == "GLOO_SOCKET_IFNAME"
    assert cpu.socket_ifname is not None and cpu.socket_ifname.matches("eth2")
    assert not cpu.socket_ifname.matches("eth10")  # exact names, as Gloo reads them
    # With the CUDA engine on, the rails carry CUDA buffers in place of NCCL's: NCCL's variable first.
    cuda = load_config({**both, "FAIRRING_CUDA_ENGINE": "1"})
    assert cuda.socket_ifname_variable == "NCCL_SOCKET_IFNAME"
    assert load_config({"GLOO_SOCKET_IFNAME": "eth1", "FAIRRING_CUDA_ENGINE": "1"}).socket_ifname_variable == (
        "GLOO_SOCKET_IFNAME"
    )
    for own in ("FAIRRING_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        assert load_config({own: "eth0", **both}).socket_ifname_variable == own


def test_the_rails_follow_nccl_ib_hca_where_fairrings_own_is_unset() -> None:
    hca = load_transport_settings({"NCCL_IB_HCA": "=mlx5_0:1"}).ib_hca
    assert hca is not None and hca.setting() == "NCCL_IB_HCA='=mlx5_0:1'" and not hca.explicit
    assert hca.selects("mlx5_0") and not hca.selects("mlx5_1")
    own = load_transport_settings({"FAIRRING_IB_HCA": "mlx5_1", "NCCL_IB_HCA": "mlx5_0"}).ib_hca
    assert own is not None and own.explicit and own.selects("mlx5_1") and not own.selects("mlx5_0")


def test_an_nccl_ib_hca_the_tensorpipe_rails_cannot_honour_is_refused_naming_the_override() -> None:
    with pytest.raises(ConfigError, match=r"NCCL_IB_HCA='mlx5_0:2': port 2 .* set FAIRRING_IB_HCA to choose"):
        load_transport_settings({"NCCL_IB_HCA": "mlx5_0:2"})
    # The NIXL rails can use any port; fairring's own variable keeps NCCL's out of the rails.
    assert load_transport_settings({"NCCL_IB_HCA": "mlx5_0:2"}, tensorpipe=False).ib_hca is not None
    assert load_transport_settings({"NCCL_IB_HCA": "mlx5_0:2", "FAIRRING_IB_HCA": "mlx5_0"}).ib_hca is not None


def test_every_setting_reaches_the_cpp_side() -> None:
    # Values unlike the defaults and each other, so a setting mapped to the wrong field shows.
    settings = Config(total_memory=96 * 2**20, slice_size=8 * 2**20, slices_in_flight=3, flat_threshold=12345)
    settings = dataclasses.replace(settings, min_shard=64 * 2**10, cuda_engine=True, timeline_directory="/tmp/t")
    settings = dataclasses.replace(settings, high_priority_streams=True)
    native = _C.Config.from_settings(settings)
    assert (native.total_memory_bytes, native.slice_size_bytes) == (96 * 2**20, 8 * 2**20)
    assert (native.max_slices_in_flight, native.min_shard_bytes) == (3, 64 * 2**10)
    assert native.cpu_flat_threshold_bytes == native.cuda_flat_threshold_bytes == 12345
    assert native.cuda_engine is True and native.timeline_directory == "/tmp/t"
    assert native.high_priority_streams is True
    assert native.network.transport == "tensorpipe" and native.network.listen_address == "127.0.0.1"
    by_device = _C.Config.from_settings(Config())
    assert (by_device.cpu_flat_threshold_bytes, by_device.cuda_flat_threshold_bytes) == (0, 16 * 2**20)
    assert by_device.timeline_directory == ""


def test_rail_failover_is_off_unless_turned_on_and_must_agree() -> None:
    assert not load_config({}).rail_failover and "FAIRRING_RAIL_FAILOVER=0" in load_config({}).describe()
    on = load_config({"FAIRRING_RAIL_FAILOVER": "1"})
    assert on.rail_failover and on.must_agree()["FAIRRING_RAIL_FAILOVER"] == 1
    with pytest.raises(ConfigError, match="FAIRRING_RAIL_FAILOVER='maybe' is not a switch"):
        load_config({"FAIRRING_RAIL_FAILOVER": "maybe"})
    # The NIXL rails cannot fence a rail's old connections (docs/design.md, "Rails that fail over").
    with pytest.raises(ConfigError, match="FAIRRING_RAIL_FAILOVER=1 needs FAIRRING_RAILS_TRANSPORT=tensorpipe"):
        load_config({"FAIRRING_RAIL_FAILOVER": "1", "FAIRRING_RAILS_TRANSPORT": "nixl"})
    assert not load_config({"FAIRRING_RAIL_FAILOVER": "0", "FAIRRING_RAILS_TRANSPORT": "nixl"}).rail_failover


@pytest.mark.parametrize(
    ("env", "mps_control", "hazard"),
    [
        ({}, False, None),
        ({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, False, "CUDA_DEVICE_MAX_CONNECTIONS=1"),
        ({"CUDA_DEVICE_MAX_CONNECTIONS": "8"}, False, None),
        ({"NCCL_LAUNCH_ORDER_IMPLICIT": "1"}, False, "NCCL_LAUNCH_ORDER_IMPLICIT=1"),
        ({}, True, "an MPS control daemon runs (/tmp/nvidia-mps/control)"),
        ({"CUDA_MPS_PIPE_DIRECTORY": "/run/mps"}, True, "an MPS control daemon runs (/run/mps/control)"),
    ],
)
def test_what_makes_a_gpu_run_kernels_in_launch_order(
    env: dict[str, str], mps_control: bool, hazard: str | None
) -> None:
    from fairring._config import launch_order_hazard

    pipes = env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    assert launch_order_hazard(env, lambda path: mps_control and path == f"{pipes}/control") == hazard


def test_a_gpu_in_launch_order_sends_cuda_all_reduces_to_nccl_unless_told() -> None:
    """The engine's launches, timed by the network, could deadlock against another communicator's on a
    GPU that runs kernels in launch order: NCCL takes them, unless FAIRRING_SERIALIZED_LAUNCHES=engine."""
    serialized = {"FAIRRING_CUDA_ENGINE": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    routed = load_config(serialized)
    assert routed.cuda_engine and routed.cuda_engine_routed_to_nccl and not routed.cuda_engine_in_use
    assert _C.Config.from_settings(routed).cuda_engine is False
    assert routed.must_agree()["FAIRRING_SERIALIZED_LAUNCHES"] == "nccl: the GPU may run kernels in launch order"
    # A group's Options(engine=True) does not override it: only the variable does.
    assert not routed.with_group_options(True, None).cuda_engine_in_use
    kept = load_config({**serialized, "FAIRRING_SERIALIZED_LAUNCHES": "Engine"})
    assert kept.cuda_engine_in_use and _C.Config.from_settings(kept).cuda_engine is True
    assert kept.must_agree()["FAIRRING_SERIALIZED_LAUNCHES"] == "engine"
    # Nothing serializes the GPU, or the engine is off: nothing to route.
    assert load_config({"FAIRRING_CUDA_ENGINE": "1"}).cuda_engine_in_use
    assert load_config({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}).must_agree()["FAIRRING_SERIALIZED_LAUNCHES"] == "unused"
    with pytest.raises(ConfigError, match="FAIRRING_SERIALIZED_LAUNCHES='ncl' is not one of nccl, engine"):
        load_config({"FAIRRING_SERIALIZED_LAUNCHES": "ncl"})


def test_cuda_wait_holds_the_stream_unless_the_host_is_asked(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default wait() on a CUDA engine op holds the caller's stream (the engine launches ahead), on
    every GPU, one that runs kernels in launch order too; FAIRRING_CUDA_WAIT=host holds the host, said once."""
    from fairring import _registration
    from fairring._registration import log_if_host_waits

    monkeypatch.setattr(_registration, "_noticed", set())  # once per process: this test's process

    assert load_config({}).cuda_wait == "stream" and _C.Config.from_settings(load_config({})).cuda_stream_hold
    serialized = load_config(
        {"FAIRRING_CUDA_ENGINE": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "FAIRRING_SERIALIZED_LAUNCHES": "engine"}
    )
    assert _C.Config.from_settings(serialized).cuda_stream_hold
    host = {"FAIRRING_CUDA_ENGINE": "1", "FAIRRING_CUDA_WAIT": "Host"}
    assert not _C.Config.from_settings(load_config(host)).cuda_stream_hold
    assert "FAIRRING_CUDA_WAIT=host" in load_config(host).describe()
    with caplog.at_level("INFO", logger="fairring"):
        log_if_host_waits(serialized)  # the stream: nothing to say
        assert not caplog.records
        log_if_host_waits(load_config(host))
        log_if_host_waits(load_config(host))
    said = [record for record in caplog.records if "hold the host until the op's result" in record.getMessage()]
    assert len(said) == 1 and said[0].levelname == "INFO", caplog.records
    with pytest.raises(ConfigError, match="FAIRRING_CUDA_WAIT='device' is not one of stream, host"):
        load_config({"FAIRRING_CUDA_WAIT": "device"})


def test_each_device_type_has_its_own_flat_threshold() -> None:
    from fairring._config import DEFAULT_CUDA_FLAT_THRESHOLD, ENGINE_OFF_THRESHOLD, MEASURED_THRESHOLD

    mib = 2**20
    # FAIRRING_FLAT_THRESHOLD alone still sets both.
    one = load_config({"FAIRRING_FLAT_THRESHOLD": "1MiB"})
    assert (one.cpu_flat_threshold, one.cuda_flat_threshold) == (mib, mib)
    both = load_config({"FAIRRING_FLAT_THRESHOLD": "1MiB", "FAIRRING_CUDA_FLAT_THRESHOLD": "8MiB"})
    assert (both.cpu_flat_threshold, both.cuda_flat_threshold) == (mib, 8 * mib)
    cpu_auto = load_config({"FAIRRING_CPU_FLAT_THRESHOLD": "auto"})
    assert (cpu_auto.cpu_flat_threshold, cpu_auto.cuda_flat_threshold) == (
        MEASURED_THRESHOLD,
        DEFAULT_CUDA_FLAT_THRESHOLD,
    )
    assert "FAIRRING_FLAT_THRESHOLD=(CPU auto, CUDA 16MiB)" in cpu_auto.describe()
    # A group's own threshold, or its engine=False, is the group's for both device types.
    assert {
        both.with_group_options(None, 0).cuda_flat_threshold,
        both.with_group_options(None, 0).cpu_flat_threshold,
    } == {0}
    off = both.with_group_options(False, None)
    assert off.cpu_flat_threshold == off.cuda_flat_threshold == ENGINE_OFF_THRESHOLD
    # Every rank must agree on each.
    assert both.must_agree()["FAIRRING_CUDA_FLAT_THRESHOLD"] == 8 * mib
    with pytest.raises(ConfigError, match="FAIRRING_CUDA_FLAT_THRESHOLD"):
        load_config({"FAIRRING_CUDA_FLAT_THRESHOLD": "lots"})


def test_the_rails_secret_is_kept_but_never_shown() -> None:
    secret = "b5c1f0e2a9d84f7c9e3a6b1d2c4e8f01"
    config = load_config({"FAIRRING_RAILS_SECRET": secret})
    assert config.rails_secret == secret
    # Ranks compare whether it is set, never its value, and no text of the config quotes it.
    assert config.must_agree()["FAIRRING_RAILS_SECRET"] == 1
    assert secret not in config.describe() and secret not in repr(config)
    assert "FAIRRING_RAILS_SECRET=(set)" in config.describe()
    assert load_config({"FAIRRING_RAILS_SECRET": ""}).rails_secret is None


def test_a_short_rails_secret_is_refused_without_quoting_it() -> None:
    with pytest.raises(ConfigError, match=r"FAIRRING_RAILS_SECRET is 9 bytes long; use at least 16") as error:
        load_config({"FAIRRING_RAILS_SECRET": "hunter2!!"})
    assert "hunter2" not in str(error.value)


def test_rails_encryption_is_refused_where_it_cannot_seal() -> None:
    assert load_config({"FAIRRING_RAILS_ENCRYPT": "1"}).rails_encrypt
    with pytest.raises(ConfigError, match="FAIRRING_RAILS_ENCRYPT=1 needs the TensorPipe rails"):
        load_config({"FAIRRING_RAILS_ENCRYPT": "1", "FAIRRING_RAILS_TRANSPORT": "nixl"})
    with pytest.raises(ConfigError, match="use FAIRRING_CUDA_WAIT=stream"):
        load_config({"FAIRRING_RAILS_ENCRYPT": "1", "FAIRRING_CUDA_ENGINE": "1", "FAIRRING_CUDA_WAIT": "host"})
    # FAIRRING_CUDA_WAIT=host moves CUDA buffers only for the CUDA engine.
    assert load_config({"FAIRRING_RAILS_ENCRYPT": "1", "FAIRRING_CUDA_WAIT": "host"}).rails_encrypt
