"""fairring as a drop-in: any group or launcher layout, the c10d surface tools use, cheap groups.

Each result is checked against a plain torch reduction of every member's input;
what fairring's accessors say is checked against the layout the test chose.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import fairring
from benchmarks.harness import InitSpec, Layout, RankFailure, RankPool
from benchmarks.reference import assert_matches, expected_view, rank_tensor, reduce_reference, topology_view
from fairring.bench import free_port

LAYOUT = Layout(2, 2)  # ranks 0, 1 on machine 0; 2, 3 on machine 1
SHAPE = (1000,)


@pytest.fixture(scope="module")
def ranks() -> Iterator[RankPool]:
    with RankPool(LAYOUT) as pool:
        yield pool


def all_reduce_among(members: list[int], group: dist.ProcessGroup | None) -> None:
    """Sums every member's rank_tensor in `group` and checks it against torch's own sum."""
    tensor = rank_tensor(dist.get_rank(), SHAPE, torch.float32)
    dist.all_reduce(tensor, group=group)
    expected = reduce_reference([rank_tensor(r, SHAPE, torch.float32) for r in members], "sum")
    assert_matches(tensor, expected)


def engine_ops(group: dist.ProcessGroup | None) -> int | None:
    stats = fairring.backend_of(group).engine_stats()
    return None if stats is None else stats["ops"]


# -- every group works -------------------------------------------------------


def irregular_subgroup() -> dict[str, object]:
    members = [0, 1, 2]  # two ranks of machine 0, one of machine 1
    group = dist.new_group(members, backend="fairring")
    if dist.get_rank() not in members:
        return {}
    all_reduce_among(members, group)
    topology = fairring.backend_of(group).topology
    view = topology_view(topology)
    return {"view": view, "regular": topology.regular, "engine_ops": engine_ops(group)}


def test_irregular_subgroup_takes_the_flat_path(ranks: RankPool) -> None:
    results = ranks.run(irregular_subgroup)
    for rank, result in enumerate(results[:3]):
        view = expected_view([[0, 1], [2]], rank)
        assert result == {"view": view, "regular": False, "engine_ops": None}


def subgroups_of_every_shape() -> dict[str, object]:
    rank = dist.get_rank()
    # new_subgroups: [0, 1] and [2, 3], one machine each: nothing crosses machines.
    local, _ = dist.new_subgroups(group_size=2, backend="fairring")
    all_reduce_among([0, 1] if rank < 2 else [2, 3], local)
    # By enumeration: [0, 2] and [1, 3] span both machines: the engine serves them.
    rails, _ = dist.new_subgroups_by_enumeration([[0, 2], [1, 3]], backend="fairring")
    all_reduce_among([0, 2] if rank % 2 == 0 else [1, 3], rails)
    return {"local_engine_ops": engine_ops(local), "rails_engine_ops": engine_ops(rails)}


def test_new_subgroups(ranks: RankPool) -> None:
    for result in ranks.run(subgroups_of_every_shape):
        assert result == {"local_engine_ops": None, "rails_engine_ops": 1}


def split_groups() -> dict[str, object]:
    rank = dist.get_rank()
    members = [0, 2] if rank % 2 == 0 else [1, 3]
    try:
        group = dist.split_group(split_ranks=[[0, 2], [1, 3]])
    except RuntimeError as error:
        if "No device associated with the default pg" not in str(error):
            raise
        return {"unsupported": f"torch {torch.__version__} splits only groups bound to a device: {error}"}
    all_reduce_among(members, group)
    backend = fairring.backend_of(group)
    # torch asks the parent once per device type; one child serves both.
    same_for_cuda = group._get_backend(torch.device("cuda")) is group._get_backend(torch.device("cpu"))
    return {
        "backend": dist.get_backend(group),
        "view": topology_view(backend.topology),
        "engine_ops": engine_ops(group),
        "one_backend": same_for_cuda,
    }


def test_split_group(ranks: RankPool) -> None:
    results = ranks.run(split_groups)
    if "unsupported" in results[0]:
        pytest.skip(results[0]["unsupported"])
    for rank, result in enumerate(results):
        view = expected_view([[0], [1]], rank // 2)
        assert result == {"backend": "fairring", "view": view, "engine_ops": 1, "one_backend": True}


def sum_and_describe() -> dict[str, object]:
    all_reduce_among(list(range(dist.get_world_size())), None)
    topology = fairring.backend_of().topology
    return {"view": topology_view(topology), "engine_ops": engine_ops(None)}


def test_irregular_deployment_takes_the_flat_path() -> None:
    # Machines of 3 ranks and 1 rank.
    env = {r: {"FAIRRING_MACHINE_ID": "big" if r < 3 else "small"} for r in range(4)}
    with RankPool(Layout(1, 4), rank_env=env) as pool:
        for rank, result in enumerate(pool.run(sum_and_describe)):
            assert result == {"view": expected_view([[0, 1, 2], [3]], rank), "engine_ops": None}


TORCHRUN_JOB = """
import torch, torch.distributed as dist, fairring
dist.init_process_group("fairring")
rank, size = dist.get_rank(), dist.get_world_size()
tensor = torch.arange(7, dtype=torch.float64) * (rank + 1)
dist.all_reduce(tensor)
expected = torch.arange(7, dtype=torch.float64) * sum(r + 1 for r in range(size))
assert torch.equal(tensor, expected), (tensor, expected)
print(f"rank {rank} of {size} ok, backend {dist.get_backend()}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_torchrun_three_processes_per_node(tmp_path: Path) -> None:
    # The checkout's fairring, as the test process imports it.
    source = str(Path(fairring.__file__).parents[1])
    path = os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
    done = run_torchrun(tmp_path, TORCHRUN_JOB, 3, PYTHONPATH=path)
    assert done.returncode == 0, done.stdout + done.stderr
    # The ranks share one pipe: their lines may interleave.
    assert sorted(re.findall(r"rank (\d) of 3 ok, backend fairring", done.stdout)) == ["0", "1", "2"], done.stdout


# A job that only names the backend: torch loads fairring through its
# `torch.distributed.backends` entry point (torch >= 2.15).
NO_IMPORT_JOB = """
import sys, torch, torch.distributed as dist
assert "fairring" not in sys.modules
dist.init_process_group("cpu:gloo,cuda:fairring")
world = dist.group.WORLD
names = [world._get_backend(torch.device(d)).name() for d in ("cpu", "cuda")]
group = dist.new_group(backend="fairring")
rank, size = dist.get_rank(), dist.get_world_size()
tensor = torch.arange(7, dtype=torch.float64) * (rank + 1)
dist.all_reduce(tensor, group=group)
expected = torch.arange(7, dtype=torch.float64) * sum(r + 1 for r in range(size))
assert torch.equal(tensor, expected), (tensor, expected)
print(f"rank {rank}: {names[0]},{names[1]},{group._get_backend(torch.device('cpu')).name()}", flush=True)
dist.destroy_process_group()
"""


def run_torchrun(tmp_path: Path, job: str, processes: int, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(job)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={processes}",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(script),
    ]  # fmt: skip
    environment = {**os.environ, "TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=150)


@pytest.mark.timeout(180)
def test_a_job_that_never_imports_fairring(tmp_path: Path) -> None:
    from importlib.metadata import PackageNotFoundError, distribution

    if not hasattr(dist.Backend, "_ensure_backend_registered"):
        pytest.skip(f"torch {torch.__version__} does not load backends from entry points (torch >= 2.15 does)")
    try:
        distribution("torch-fairring")
    except PackageNotFoundError:
        pytest.skip("fairring is not installed in this environment (`make build` installs the checkout editable)")
    # Only the installed distribution: not a checkout on PYTHONPATH.
    done = run_torchrun(tmp_path, NO_IMPORT_JOB, 2, PYTHONPATH="")
    assert done.returncode == 0, done.stdout + done.stderr
    # The ranks share one pipe: their lines may interleave.
    found = sorted(re.findall(r"rank (\d): (gloo|fairring),(gloo|fairring),(gloo|fairring)", done.stdout))
    assert found == [(str(r), "gloo", "fairring", "fairring") for r in range(2)], done.stdout


# -- the c10d surface --------------------------------------------------------


def ddp_logging_name() -> str:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    return model._get_ddp_logging_data()["backend_name"]


def test_ddp_logging_names_fairring(ranks: RankPool) -> None:
    assert ranks.run(ddp_logging_name) == ["fairring"] * LAYOUT.world_size


def sequence_numbers() -> dict[str, object]:
    backend = fairring.backend_of()
    start = backend._get_sequence_number_for_group()
    tensor = rank_tensor(dist.get_rank(), SHAPE, torch.float32)
    engine_work = dist.all_reduce(tensor, async_op=True)
    engine_work.wait()
    dist.broadcast(tensor, src=0)  # Gloo's
    dist.barrier()
    dist.all_reduce(tensor)
    numbers = {"start": start, "end": backend._get_sequence_number_for_group()}
    if hasattr(engine_work, "_get_sequence_number"):  # bound from torch 2.12 on
        numbers["engine_work"] = engine_work._get_sequence_number()
    return numbers


def test_sequence_numbers_count_collectives_alike_on_every_rank(ranks: RankPool) -> None:
    results = ranks.run(sequence_numbers)
    assert all(result == results[0] for result in results), results
    assert results[0]["end"] - results[0]["start"] == 4
    if "engine_work" in results[0]:
        assert results[0]["engine_work"] == results[0]["start"] + 1


# torch 2.11's monitored_barrier refuses every backend but Gloo by name.
GLOO_ONLY = "monitored_barrier is only implemented for GLOO backend"


def set_timeout() -> float:
    backend = fairring.backend_of()
    # ProcessGroup.set_timeout reaches every backend of the group (torch 2.11's
    # _set_pg_timeout reaches only Gloo and NCCL ones).
    dist.group.WORLD.set_timeout(timedelta(seconds=42))
    seconds = backend.timeout.total_seconds()
    dist.group.WORLD.set_timeout(timedelta(seconds=60))
    return seconds


def test_set_timeout(ranks: RankPool) -> None:
    assert ranks.run(set_timeout) == [42.0] * LAYOUT.world_size


def monitored_barriers() -> str:
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=30))
    except ValueError as error:
        if GLOO_ONLY not in str(error):
            raise
        return f"torch {torch.__version__}: {error}"
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)
    return "passed"


def test_monitored_barrier(ranks: RankPool) -> None:
    outcomes = ranks.run(monitored_barriers)
    if outcomes[0] != "passed":
        pytest.skip(outcomes[0])
    assert outcomes == ["passed"] * LAYOUT.world_size


def monitored_barrier_without(absent: int) -> str:
    if dist.get_rank() == absent:
        time.sleep(4)  # past the others' barrier timeout
        return "absent"
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=2))
    except ValueError as error:
        if GLOO_ONLY not in str(error):
            raise
        return f"torch {torch.__version__}: {error}"
    return "passed"


def test_monitored_barrier_names_the_missing_rank() -> None:
    with RankPool(Layout(2, 1)) as pool, pytest.raises(RankFailure) as failure:
        outcomes = pool.run_per_rank(monitored_barrier_without, lambda rank: (1,), timeout=60)
        if GLOO_ONLY in outcomes[0]:
            pytest.skip(outcomes[0])
    assert "Rank 1 failed to pass monitoredBarrier" in failure.value.outcomes[0], failure.value.outcomes


def debug_detail_state() -> dict[str, object]:
    wrapper = dist.group.WORLD._get_backend(torch.device("cpu"))
    all_reduce_among(list(range(dist.get_world_size())), None)
    backend = fairring.backend_of()
    state = {
        "wrapped": type(wrapper).__name__,
        "engine_ops": engine_ops(None),
        "rails": backend.rails() is not None,
        "view": topology_view(backend.topology),
    }
    # What DETAIL is for: ranks that disagree fail at once, naming the mismatch.
    try:
        dist.all_reduce(torch.ones(3 + dist.get_rank()))
        state["mismatch"] = "not detected"
    except RuntimeError as error:
        state["mismatch"] = "detected" if "mismatch" in str(error).lower() else str(error)
    return state


def test_torch_distributed_debug_detail() -> None:
    spec = InitSpec(extra_env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    with RankPool(Layout(2, 1), spec) as pool:
        for rank, state in enumerate(pool.run(debug_detail_state)):
            assert state == {
                "wrapped": "_ProcessGroupWrapper",
                "engine_ops": 1,
                "rails": True,
                "view": expected_view([[0], [1]], rank),
                "mismatch": "detected",
            }


def test_backend_of_refuses_other_backends(ranks: RankPool) -> None:
    ranks.run(backend_of_a_gloo_group)


def backend_of_a_gloo_group() -> None:
    group = dist.new_group(backend="gloo")
    with pytest.raises(ValueError, match="serves cpu tensors with ProcessGroupGloo, not fairring"):
        fairring.backend_of(group)


# -- cheap groups --------------------------------------------------------------


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def group_costs() -> dict[str, object]:
    before = threads()
    gloo = dist.new_group(backend="gloo")
    gloo_threads = threads() - before
    before = threads()
    group = dist.new_group(backend="fairring")
    fairring_threads = threads() - before
    backend = fairring.backend_of(group)
    idle = (backend.engine_stats(), backend.staging_stats(), backend.rails())
    all_reduce_among(list(range(dist.get_world_size())), group)
    used = (backend.engine_stats() is not None, backend.staging_stats() is not None, backend.rails() is not None)
    for made in (gloo, group):
        dist.destroy_process_group(made)
    return {"threads_beyond_gloo": fairring_threads - gloo_threads, "idle": idle, "used": used}


def test_a_group_costs_nothing_beyond_gloo_until_it_all_reduces(ranks: RankPool) -> None:
    for result in ranks.run(group_costs):
        assert result["idle"] == (None, None, None)
        assert result["used"] == (True, True, True)
        # Slack of one for a thread some library starts lazily.
        assert result["threads_beyond_gloo"] <= 1, result


# -- pg_options -----------------------------------------------------------------------


def groups_by_options() -> dict[str, object]:
    everyone = list(range(dist.get_world_size()))
    groups: dict[str, object] = {
        "off": fairring.Options(engine=False),
        "default": None,
        "forced": fairring.Options(engine=True, flat_threshold=0),
    }
    nccl_options = getattr(getattr(dist, "ProcessGroupNCCL", None), "Options", None)
    if nccl_options is not None:
        groups["an NCCL job's"] = nccl_options(is_high_priority_stream=True)
    ops = {}
    for name, options in groups.items():
        group = dist.new_group(backend="fairring", pg_options=options)
        all_reduce_among(everyone, group)
        ops[name] = engine_ops(group)
    return ops


def test_pg_options_keep_a_group_off_the_engine_or_on_it(ranks: RankPool) -> None:
    for ops in ranks.run(groups_by_options):
        assert ops["off"] is None, ops  # no engine was ever made for that group
        assert all(count == 1 for name, count in ops.items() if name != "off"), ops


def test_one_variable_rolls_every_group_back_whatever_its_options() -> None:
    """FAIRRING_ENGINE_DISABLE=1: no group makes an engine, the forced one included, and every sum is right
    (the test above is its negative control: the same groups without it)."""
    with RankPool(LAYOUT, InitSpec(extra_env={"FAIRRING_ENGINE_DISABLE": "1"})) as pool:
        for ops in pool.run(groups_by_options):
            assert all(count is None for count in ops.values()), ops


def test_the_rollback_is_logged_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from fairring import _registration
    from fairring._config import load_config

    monkeypatch.setattr(_registration, "_noticed", set())
    disabled = load_config({"FAIRRING_ENGINE_DISABLE": "1"}).with_group_options(True, 0)
    with caplog.at_level("WARNING", logger="fairring"):
        for _ in range(3):
            _registration.warn_if_engine_disabled(disabled)
        _registration.warn_if_engine_disabled(load_config({}))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["FAIRRING_ENGINE_DISABLE=1"]


def init_with_pg_options(options: object) -> str:
    try:
        dist.new_group(backend="fairring", pg_options=options)
    except (TypeError, fairring.ConfigError) as error:
        return str(error)
    return "made"


def test_pg_options_that_cannot_be_used_are_refused() -> None:
    with RankPool(Layout(2, 1)) as pool:
        refused = pool.run(init_with_pg_options, {"engine": False})
        assert all("pg_options of type dict cannot be used; pass fairring.Options(" in text for text in refused)
    with RankPool(Layout(2, 1)) as pool:
        per_rank = pool.run_per_rank(init_with_pg_options, lambda rank: (fairring.Options(engine=rank == 0),))
        for text in per_rank:
            assert "fairring.Options.engine differs across ranks" in text, per_rank


def subgroup_of_a_bound_world() -> str:
    """A subgroup made after init_process_group(device_id=...): torch then asks non-members to split too."""
    dist.group.WORLD.bound_device_id = torch.device("cpu", 0)  # as init_process_group(device_id=...) does
    try:
        members = [0, 1]
        try:
            group = dist.new_group(members, backend="fairring")
        except ValueError as error:
            if "must be an accelerator" not in str(error):
                raise
            return f"skip: {error}"  # torch < 2.15 binds accelerators only: the case cannot arise
        if dist.get_rank() in members:
            all_reduce_among(members, group)
        return "ok"
    finally:
        dist.group.WORLD.bound_device_id = None


def test_subgroups_of_a_world_bound_to_a_device(ranks: RankPool) -> None:
    outcomes = ranks.run(subgroup_of_a_bound_world)
    if all(outcome.startswith("skip: ") for outcome in outcomes):
        pytest.skip(f"torch {torch.__version__} on CPU: {outcomes[0].removeprefix('skip: ')}")
    assert outcomes == ["ok"] * LAYOUT.world_size
