"""The engine's plans, computed without running them (csrc/engine/plan.h): the arithmetic on its own
(slices, padding, the unit, the slice size), then plans from 8 to 1,024 machines.

No over-sharding: slices grow so that shards keep at least FAIRRING_MIN_SHARD_SIZE,
as far as the staging memory holds two slices; past that, the plan says so.
"""

from __future__ import annotations

import logging

import pytest

from fairring import _C
from fairring._config import DEFAULT_SLICES_IN_FLIGHT, load_config
from fairring._plan_log import describe_plans, floor_advice
from fairring.bench import model

pytestmark = pytest.mark.timeout(60)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
MACHINES = [8, 16, 32, 64, 128, 256, 512, 1024]
RANKS_PER_MACHINE = 8


# --- the arithmetic on its own ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("numel", "slice_numel", "unit", "slices"),
    [
        (0, 8, 4, []),
        (3, 8, 4, [(0, 3, 4)]),  # shorter than a unit: one padded slice
        (8, 8, 4, [(0, 8, 8)]),
        (21, 8, 4, [(0, 8, 8), (8, 8, 8), (16, 5, 8)]),  # the remainder rides in the last slice
        (12, 12, 6, [(0, 12, 12)]),
        (13, 12, 6, [(0, 12, 12), (12, 1, 6)]),
    ],
)
def test_plan_is_one_pipeline_with_a_padded_last_slice(numel: int, slice_numel: int, unit: int, slices: list) -> None:
    plan = _C._testing.plan(numel, slice_numel, unit)
    assert plan == slices
    # Every element is covered once, every padded slice divides by the unit.
    assert sum(n for _, n, _ in plan) == numel
    assert all(padded % unit == 0 and padded >= n for _, n, padded in plan)


@pytest.mark.parametrize(
    ("local_size", "machines", "element_size", "min_shard_bytes", "unit"),
    [
        (2, 2, 4, 1, 4),  # CPU: one element per (rank, machine) pair
        (2, 2, 2, 32, 64),  # CUDA, float16: shards of 16 elements (32 bytes)
        (1, 2, 8, 32, 8),  # CUDA, float64: shards of 4 elements
        (8, 1000, 4, 32, 64_000),
    ],
)
def test_plan_unit_keeps_shards_above_the_transport_floor(
    local_size: int, machines: int, element_size: int, min_shard_bytes: int, unit: int
) -> None:
    # The floor depends on the device type only, so every rank plans alike.
    assert _C._testing.plan_unit(local_size, machines, element_size, min_shard_bytes) == unit


def test_slice_numel_is_a_positive_multiple_of_the_unit() -> None:
    assert _C._testing.slice_numel_for(25 * 2**20, 4, 4) == 25 * 2**20 // 4
    assert _C._testing.slice_numel_for(100, 4, 6) == 24  # 25 elements fit, 24 divide evenly by the unit
    assert _C._testing.slice_numel_for(8, 8, 6) == 6  # never zero: one unit at least


@pytest.mark.parametrize(
    ("tensor_bytes", "max_slice", "expected"),
    [
        (100 * MiB, 4 * MiB, 4 * MiB),  # long: the maximum
        (24 * MiB, 4 * MiB, 3 * MiB),  # 8 slices deep
        (8 * MiB, 4 * MiB, 2 * MiB),  # not below half the maximum
        (1024, 4 * MiB, 2 * MiB),  # one slice, as short as the tensor
        (0, 4 * MiB, 2 * MiB),
        (10, 1, 1),
    ],
)
def test_slice_size_pipelines_short_tensors(tensor_bytes: int, max_slice: int, expected: int) -> None:
    assert _C.slice_bytes_for(tensor_bytes, max_slice) == expected


# --- plans at scale ------------------------------------------------------------------------------------


def shape(tensor_bytes: int, machines: int, *, min_shard: int, memory: int, slice_size: int = 4 * MiB) -> dict:
    return _C.plan_shape(
        numel=tensor_bytes // 4,
        element_size=4,
        local_size=RANKS_PER_MACHINE,
        machines=machines,
        transport_min_shard_bytes=_C.CUDA_MIN_SHARD_BYTES,
        max_slice_bytes=slice_size,
        min_shard_bytes=min_shard,
        total_memory_bytes=memory,
        max_slices_in_flight=DEFAULT_SLICES_IN_FLIGHT,
    )


def padded_staging(plan: dict, machines: int) -> int:
    return _C.staging_bytes_for(plan["slice_numel"] * 4, RANKS_PER_MACHINE, machines)


@pytest.mark.parametrize("machines", MACHINES)
def test_shards_keep_the_floor_where_staging_holds_two_slices(machines: int) -> None:
    floor, memory = 256 * KiB, 16 * GiB  # room for the floor at every scale
    plan = shape(8 * GiB, machines, min_shard=floor, memory=memory)  # several slices even at 1,024
    assert plan["shard_bytes"] >= floor
    assert not plan["below_floor"]
    assert plan["slices_in_flight"] >= 2
    assert padded_staging(plan, machines) <= memory
    # Slices grow with the machines: exactly the floor's slice once it exceeds the 4 MiB default.
    ranks = RANKS_PER_MACHINE * machines
    assert plan["slice_numel"] * 4 == max(4 * MiB, ranks * floor)


@pytest.mark.parametrize("machines", MACHINES)
def test_with_the_default_memory_slices_grow_until_it_runs_out(machines: int) -> None:
    floor, memory = 256 * KiB, 50 * MiB
    plan = shape(GiB, machines, min_shard=floor, memory=memory)
    without = shape(GiB, machines, min_shard=0, memory=memory)
    # Never smaller shards than without a floor, and two slices always fit.
    assert plan["shard_bytes"] >= without["shard_bytes"]
    assert plan["slices_in_flight"] >= 2 and padded_staging(plan, machines) <= memory
    if plan["below_floor"]:
        # As long as two fit: another unit would not.
        unit = plan["unit"]
        staging = _C.staging_bytes_for((plan["slice_numel"] + unit) * 4, RANKS_PER_MACHINE, machines, padded=False)
        assert staging > memory // 2
    else:
        assert plan["shard_bytes"] >= floor


def test_without_a_floor_shards_shrink_as_machines_are_added() -> None:
    shards = [shape(GiB, m, min_shard=0, memory=50 * MiB)["shard_bytes"] for m in MACHINES]
    assert shards == [4 * MiB // (RANKS_PER_MACHINE * m) for m in MACHINES]  # 64 KiB down to 512 B
    floored = [shape(8 * GiB, m, min_shard=256 * KiB, memory=16 * GiB)["shard_bytes"] for m in MACHINES]
    assert min(floored) == 256 * KiB


def test_a_tensor_of_one_slice_is_not_flagged() -> None:
    """Its shards are short because it is, not because of the plan: the size dispatch's business."""
    plan = shape(MiB, 128, min_shard=256 * KiB, memory=50 * MiB)
    assert plan["slices"] == 1 and not plan["below_floor"]
    assert plan["shard_bytes"] == MiB // (RANKS_PER_MACHINE * 128)


def test_small_clusters_keep_the_pipeline_depth() -> None:
    """2 x 2, 16 MiB: the floor's slice (1 MiB) is below the 8-deep pipeline's 2 MiB slices."""
    plan = _C.plan_shape(
        numel=4 * MiB,
        element_size=4,
        local_size=2,
        machines=2,
        transport_min_shard_bytes=1,
        max_slice_bytes=4 * MiB,
        min_shard_bytes=256 * KiB,
        total_memory_bytes=50 * MiB,
        max_slices_in_flight=DEFAULT_SLICES_IN_FLIGHT,
    )
    assert plan["slices"] == 8 and plan["shard_bytes"] == 512 * KiB


@pytest.mark.parametrize("machines", [2, 4, 8, 1024])
@pytest.mark.parametrize("cap", [1, 4, 8])
def test_slices_in_flight_are_capped_and_staging_sized_to_match(machines: int, cap: int) -> None:
    """At most FAIRRING_SLICES_IN_FLIGHT full slices; the staging holds that many, and a padded one."""
    memory = 50 * MiB
    plan = _C.plan_shape(
        numel=GiB // 4,
        element_size=4,
        local_size=2,
        machines=machines,
        transport_min_shard_bytes=1,
        max_slice_bytes=4 * MiB,
        min_shard_bytes=256 * KiB,
        total_memory_bytes=memory,
        max_slices_in_flight=cap,
    )
    padded = _C.staging_bytes_for(plan["slice_numel"] * 4, 2, machines)
    fitting = memory // plan["staging_bytes"]
    assert plan["slices_in_flight"] == min(cap, fitting)
    assert padded <= plan["staging_capacity"] <= memory
    assert plan["staging_capacity"] >= plan["slices_in_flight"] * plan["staging_bytes"]
    if cap * plan["staging_bytes"] >= memory:
        assert plan["staging_capacity"] == memory
    else:  # no more than the cap's slices (or one padded one) need, give or take a unit's rounding
        assert plan["staging_capacity"] <= max(cap * plan["staging_bytes"], padded) + cap * plan["unit"] * 4


def test_debug_log_lists_every_size_class_and_advises_memory() -> None:
    topology = _C.Topology(0, [[m * 8 + r for r in range(8)] for m in range(128)])
    config = load_config({})
    lines = describe_plans(config, topology, "cpu")
    assert len(lines) == 11 and lines[0].strip().startswith("1KiB") and lines[-1].strip().startswith("1GiB")
    assert "below FAIRRING_MIN_SHARD_SIZE" in lines[-1]
    cuda = describe_plans(config, topology, "cuda")
    assert "the delegate (below FAIRRING_FLAT_THRESHOLD=16MiB)" in cuda[0]
    advice = floor_advice(config, topology, "cpu")
    assert advice is not None and "Set FAIRRING_TOTAL_MEMORY to at least" in advice
    needed = advice.split("at least ")[1].split(" for")[0]
    # With that much memory (a value FAIRRING_TOTAL_MEMORY takes as written) the floor holds, and
    # not with 5% less: the advice asks for what the plan needs, not more.
    assert floor_advice(load_config({"FAIRRING_TOTAL_MEMORY": needed}), topology, "cpu") is None
    less = str(int(int(needed.removesuffix("MiB")) * MiB * 0.95))
    assert floor_advice(load_config({"FAIRRING_TOTAL_MEMORY": less}), topology, "cpu") is not None


def test_create_backend_logs_plans_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    from fairring._registration import log_plans

    topology = _C.Topology(0, [[0, 1], [2, 3]])
    with caplog.at_level(logging.DEBUG, logger="fairring"):
        log_plans(load_config({}), topology)
    assert "cpu all-reduces of float32 take:" in caplog.text and "64MiB: 16 slices of 4 MiB" in caplog.text


@pytest.mark.parametrize("min_shard", [0, 64 * KiB, 256 * KiB])
def test_the_scaling_model_plans_as_the_engine_does(min_shard: int) -> None:
    settings = model.FairringSettings(min_shard=min_shard or None)
    for machines in [2, 4, 8, 64, 1024]:
        for ranks in [1, 2, 8]:
            for tensor_bytes in [4 * KiB, 3 * MiB, 16 * MiB, 100 * MiB, GiB]:
                expected = _C.plan_shape(
                    numel=tensor_bytes // 4,
                    element_size=4,
                    local_size=ranks,
                    machines=machines,
                    transport_min_shard_bytes=1,
                    max_slice_bytes=settings.slice_size,
                    min_shard_bytes=min_shard,
                    total_memory_bytes=settings.total_memory,
                    max_slices_in_flight=settings.slices_in_flight,
                )
                plan = model.plan(tensor_bytes, machines, ranks, settings)
                where = f"{machines} x {ranks}, {tensor_bytes} bytes"
                assert plan.slices == expected["slices"], where
                if expected["slices"] > 1:
                    assert plan.slice_bytes == expected["slice_numel"] * 4, where
                    assert plan.below_floor == expected["below_floor"], where
                    assert plan.inflight == expected["slices_in_flight"], where


def test_the_cuda_staging_must_fit_in_the_gpus_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked against the GPU's free memory when the CUDA engine is made, not against the host's."""
    import torch

    from fairring._config import ConfigError
    from fairring._registration import check_device_memory

    topology = _C.Topology(0, [[0, 1], [2, 3]])
    config = load_config({})
    staging = _C.plan_shape(
        numel=config.slice_size // 4,
        element_size=4,
        local_size=2,
        machines=2,
        transport_min_shard_bytes=_C.CUDA_MIN_SHARD_BYTES,
        max_slice_bytes=config.slice_size,
        min_shard_bytes=config.min_shard,
        total_memory_bytes=config.total_memory,
        max_slices_in_flight=config.slices_in_flight,
    )["staging_capacity"]
    free = {"bytes": staging - 1}
    cached = {"bytes": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free["bytes"], 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 5 * GiB + cached["bytes"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 5 * GiB)
    expected = r"does not fit in the .* free of cuda:0's 80GiB \(0B of it cached by torch's allocator\): lower "
    with pytest.raises(ConfigError, match=expected + "FAIRRING_TOTAL_MEMORY"):
        check_device_memory(config, topology, torch.device("cuda:0"))
    free["bytes"] = staging
    check_device_memory(config, topology, torch.device("cuda:0"))
    # The allocator's free blocks count: it releases them before it fails.
    free["bytes"], cached["bytes"] = staging - 1, 1
    check_device_memory(config, topology, torch.device("cuda:0"))
