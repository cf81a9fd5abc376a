"""RDMA fork safety: what fairring notes at import, what libibverbs reports, and forked DataLoader workers.

This machine has no InfiniBand, so a stand-in libibverbs.so.1 (built here from
a few lines of C) lists two devices and, like rdma-core's ibverbs_init, turns
fork protection on at its first ibv_get_device_list if RDMAV_FORK_SAFE or
IBV_FORK_SAFE exists. Each scenario runs in a fresh interpreter: what was
loaded, and when, is per process.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import fairring
from benchmarks.harness import Layout, RankPool
from benchmarks.reference import all_ranks_reduced, assert_matches, rank_tensor
from fairring._config import load_config
from fairring._transports import rails_transports

REPO = Path(__file__).resolve().parent.parent
FORK_SAFE_VARIABLES = ("RDMAV_FORK_SAFE", "IBV_FORK_SAFE")

FAKE_LIBIBVERBS = r"""
#include <errno.h>
#include <stdlib.h>

struct ibv_device { const char *name; };
static struct ibv_device devices[2] = {{"mlx5_1"}, {"mlx5_0"}};
static int initialised, protected_from_fork;

struct ibv_device **ibv_get_device_list(int *count) {
    if (!initialised) {  /* as rdma-core's ibverbs_init: presence, not value */
        initialised = 1;
        protected_from_fork = getenv("RDMAV_FORK_SAFE") || getenv("IBV_FORK_SAFE");
    }
    const char *fail = getenv("FAKE_IBV_ERRNO");
    if (fail) { errno = atoi(fail); return NULL; }
    struct ibv_device **list = calloc(3, sizeof *list);
    list[0] = &devices[0];
    list[1] = &devices[1];
    if (count) *count = 2;
    return list;
}
const char *ibv_get_device_name(struct ibv_device *device) { return device->name; }
void ibv_free_device_list(struct ibv_device **list) { free(list); }
int ibv_is_fork_initialized(void) { return protected_from_fork ? 1 : 0; }
"""


@pytest.fixture(scope="module")
def fake_host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with lib/libibverbs.so.1 (the stand-in) and a sysfs tree showing its two devices."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in libibverbs")
    root = tmp_path_factory.mktemp("fake_host")
    (root / "lib").mkdir()
    (root / "verbs.c").write_text(FAKE_LIBIBVERBS)
    subprocess.run(
        [
            compiler,
            "-shared",
            "-fPIC",
            "-Wl,-soname,libibverbs.so.1",
            "-o",
            root / "lib/libibverbs.so.1",
            root / "verbs.c",
        ],
        check=True,
        timeout=60,
    )
    for name in ("mlx5_0", "mlx5_1"):
        port = root / "sys/class/infiniband" / name / "ports/1"
        port.mkdir(parents=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "link_layer").write_text("InfiniBand\n")
    return root


def run_python(code: str, env: dict[str, str], timeout: float = 120) -> dict[str, object]:
    """Runs `code` in a fresh interpreter with exactly `env` (plus PATH); returns the JSON it prints last."""
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), **env}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=clean, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# The discovery module alone (standard library only), without importing fairring and torch.
LOAD_INFINIBAND = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("infiniband", {str(REPO / "fairring/_infiniband.py")!r})
infiniband = importlib.util.module_from_spec(spec)
sys.modules["infiniband"] = infiniband
spec.loader.exec_module(infiniband)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("env", "names", "status", "error"),
    [
        ({"RDMAV_FORK_SAFE": "1"}, ["mlx5_1", "mlx5_0"], "enabled", None),
        ({"IBV_FORK_SAFE": "0"}, ["mlx5_1", "mlx5_0"], "enabled", None),  # presence is what counts
        ({}, ["mlx5_1", "mlx5_0"], "disabled", None),
        ({"FAKE_IBV_ERRNO": "38"}, [], "disabled", "the kernel's InfiniBand (uverbs) modules are not loaded"),
        ({"FAKE_IBV_ERRNO": "-38"}, [], "disabled", "modules are not loaded (ibv_get_device_list: ENOSYS)"),
        ({"FAKE_IBV_ERRNO": "13"}, [], "disabled", "ibv_get_device_list failed (Permission denied)"),
    ],
)
def test_probe_verbs_lists_devices_in_libibverbs_order_with_its_fork_status(
    fake_host: Path, env: dict[str, str], names: list[str], status: str, error: str | None
) -> None:
    result = run_python(
        LOAD_INFINIBAND
        + f"""
probe = infiniband.probe_verbs({str(fake_host / "lib/libibverbs.so.1")!r})
print(json.dumps({{"names": list(probe.names), "status": probe.fork_status, "error": probe.error}}))
""",
        env,
    )
    assert result["names"] == names and result["status"] == status
    assert (result["error"] is None) if error is None else (error in str(result["error"]))


@pytest.mark.timeout(60)
def test_probe_verbs_says_why_libibverbs_cannot_be_loaded(tmp_path: Path) -> None:
    result = run_python(
        LOAD_INFINIBAND
        + f"""
print(json.dumps({{"error": infiniband.probe_verbs({str(tmp_path / "libibverbs.so.1")!r}).error}}))
""",
        {},
    )
    assert str(result["error"]).startswith(f"{tmp_path / 'libibverbs.so.1'} cannot be loaded (")


# Loads libibverbs (as another library could) before fairring, initialising it
# or not, then decides what the rails use on the fake host.
PRELOAD_THEN_IMPORT = """
import ctypes, json, os
early = os.environ.get("LOAD_EARLY")
if early:
    verbs = ctypes.CDLL("libibverbs.so.1")
    if early == "initialise":
        verbs.ibv_get_device_list.restype = ctypes.c_void_p
        verbs.ibv_get_device_list(None)
import fairring
from fairring._config import ConfigError, load_transport_settings
from fairring._infiniband import IMPORT_STATE, probe_host
from fairring._transports import decide
facts = probe_host(os.environ["FAKE_ROOT"])
decision = decide(load_transport_settings(), facts, cuda=False)
try:
    decide(load_transport_settings({"FAIRRING_TRANSPORTS": "ibv"}), facts, cuda=False)
    required = None
except ConfigError as error:
    required = str(error)
print(json.dumps({
    "user_values": [list(pair) for pair in IMPORT_STATE.user_values],
    "loaded_at_import": IMPORT_STATE.ibverbs_loaded,
    "environ": {name: os.environ.get(name) for name in fairring._infiniband.FORK_SAFE_VARIABLES},
    "status": facts.fork.status,
    "transports": decision.transports,
    "ibv": decision.reason("ibv"),
    "fork": decision.reason("fork safety"),
    "required": required,
}))
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("load_early", "user_env", "safe"),
    [
        (None, {}, True),
        ("load", {}, True),  # loaded but not initialised: it still reads the variables fairring set
        ("initialise", {}, False),  # initialised before fairring set them: fork protection is off
        ("initialise", {"RDMAV_FORK_SAFE": "0"}, True),  # the user's variable was there: on, whatever its value
    ],
    ids=["fairring-first", "loaded-early", "initialised-early", "user-set-0"],
)
def test_fairring_notes_at_import_whether_libibverbs_came_first(
    fake_host: Path, load_early: str | None, user_env: dict[str, str], safe: bool
) -> None:
    env = {"LD_LIBRARY_PATH": str(fake_host / "lib"), "FAKE_ROOT": str(fake_host), **user_env}
    if load_early:
        env["LOAD_EARLY"] = load_early
    result = run_python(PRELOAD_THEN_IMPORT, env)
    assert result["loaded_at_import"] is (load_early is not None)
    assert result["user_values"] == [list(pair) for pair in user_env.items()]
    # fairring sets what the user did not, and keeps what the user set.
    assert result["environ"] == {"RDMAV_FORK_SAFE": "1", "IBV_FORK_SAFE": "1", **user_env}
    if safe:
        assert result["status"] == "enabled" and result["transports"] == ["ibv", "uv"]
        assert str(result["ibv"]).startswith("used: mlx5_1 port 1 (InfiniBand, ACTIVE), the first device")
        assert result["required"] is None
    else:
        assert result["status"] == "disabled" and result["transports"] == ["uv"]
        assert "not fork-safe: libibverbs.so.1 was loaded before fairring set RDMAV_FORK_SAFE" in str(result["ibv"])
        assert "import fairring before anything that loads libibverbs" in str(result["required"])
        assert str(result["required"]).startswith("FAIRRING_TRANSPORTS='ibv' requires ibv, but the rails cannot")
    if user_env:
        assert "RDMAV_FORK_SAFE='0' does not turn it off" in str(result["fork"])


# --- forked DataLoader workers next to live rails ----------------------------------------------------

NUMEL = 1 << 20  # 4 MiB of float32: several slices through the engine and its rails
SAMPLES = 24


class Squares(Dataset):
    """Sample i: i, i squared, and what the worker that made it sees."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, object]:
        return {
            "index": index,
            "square": torch.tensor(index * index),
            "pid": os.getpid(),
            **{name: os.environ.get(name, "unset") for name in FORK_SAFE_VARIABLES},
        }


def all_reduce_and_check(seed: int) -> dict[str, object]:
    tensor = rank_tensor(dist.get_rank(), (NUMEL,), torch.float32, seed=seed)
    dist.all_reduce(tensor)
    assert_matches(tensor, all_ranks_reduced((NUMEL,), torch.float32, seed=seed))
    backend = fairring.backend_of()
    rails = backend.rails("cpu")
    return {"rails": None if rails is None else rails["description"], "stats": backend.engine_stats("cpu")}


def rails_decision() -> dict[str, object]:
    decision = rails_transports(load_config().transport, cuda=False)
    return {"transports": decision.transports, "fork": decision.reason("fork safety")}


def iterate_forked_loader() -> dict[str, object]:
    process = mp.current_process()
    daemonic = process.daemon
    # The harness's ranks are daemonic, and multiprocessing lets no daemonic process start children.
    process.daemon = False
    try:
        loader = DataLoader(Squares(), batch_size=4, num_workers=2, multiprocessing_context="fork")
        indices, pids, seen = [], set(), {name: set() for name in FORK_SAFE_VARIABLES}
        for batch in loader:
            assert torch.equal(batch["square"], batch["index"] * batch["index"])
            indices += batch["index"].tolist()
            pids |= set(batch["pid"].tolist())
            for name in FORK_SAFE_VARIABLES:
                seen[name] |= set(batch[name])
    finally:
        process.daemon = daemonic
    return {
        "indices": indices,
        "workers": len(pids - {os.getpid()}),
        "seen": {name: sorted(values) for name, values in seen.items()},
        "own": {name: os.environ.get(name) for name in FORK_SAFE_VARIABLES},
    }


@pytest.mark.timeout(300)
def test_forked_data_loader_workers_next_to_live_rails() -> None:
    with RankPool(Layout(2, 2)) as ranks:
        before = ranks.run(all_reduce_and_check, 0)
        for result in before:
            assert result["rails"] is not None, "the first all-reduce builds the engine and its rails"
            assert result["stats"]["ops"] >= 1 and result["stats"]["rail_bytes_sent"] > 0
        for decision in ranks.run(rails_decision):
            assert decision["transports"][-1] == "uv" and str(decision["fork"]).startswith("safe: ")

        for loaded in ranks.run(iterate_forked_loader):
            assert loaded["indices"] == list(range(SAMPLES))
            assert loaded["workers"] == 2
            # Forked workers inherit the variables, set (by fairring, unless the user did) before
            # anything could load libibverbs.
            assert all(value not in (None, "unset") for value in loaded["own"].values())
            assert loaded["seen"] == {name: [value] for name, value in loaded["own"].items()}

        after = ranks.run(all_reduce_and_check, 1)
        for result, earlier in zip(after, before, strict=True):
            assert result["stats"]["ops"] > earlier["stats"]["ops"]
            # The same rails: the same listener (TensorPipe) or agent (NIXL), named before the first ";"
            # (NIXL's description goes on with counters that move).
            same = result["rails"].split(";")[0] == earlier["rails"].split(";")[0]
            assert same, ("the same rails serve the all-reduce after the fork", earlier["rails"], result["rails"])
