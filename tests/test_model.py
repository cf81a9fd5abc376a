"""The cost model (fairring/bench/model.py): closed forms, the plan mirror, bounds, calibration."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fairring._sizes import GiB, KiB, MiB
from fairring.bench import model

pytestmark = pytest.mark.timeout(60)

# Round numbers, so that expected times can be worked out by hand.
HAND = model.Params(
    link_Bps=125e6,
    alpha_s=1e-3,
    nics_per_machine=1,
    local_Bps=1e9,
    local_alpha_s=1e-4,
    slice_cpu_s=1e-4,
    reduce_Bps=1e9,
)


# --- ring, tree, bound -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("machines", "ranks", "nics", "pipelined", "expected"),
    [
        # 2 x 2, 1 MiB: chunk 262144 B; 6 steps of 1 ms + 2.097152 ms (the NIC), 3 reductions.
        (2, 2, 1, False, 6 * (1e-3 + 262144 / 125e6) + 3 * 262144 / 1e9),
        # Pipelined: 2 steps pay alpha, 4 pay local_alpha; bandwidth as before.
        (2, 2, 1, True, 2e-3 + 4e-4 + 6 * 262144 / 125e6 + 3 * 262144 / 1e9),
        # One machine of 4: every edge local.
        (1, 4, 1, False, 6 * (1e-4 + 262144 / 1e9) + 3 * 262144 / 1e9),
        # Two NICs: two rings, each over half the tensor.
        (2, 2, 2, False, 6 * (1e-3 + 131072 / 125e6) + 3 * 262144 / 1e9),
    ],
)
def test_ring_time_is_the_closed_form(machines: int, ranks: int, nics: int, pipelined: bool, expected: float) -> None:
    params = replace(HAND, nics_per_machine=nics)
    assert model.ring_time(MiB, machines, ranks, params, pipelined=pipelined) == pytest.approx(expected, rel=1e-12)


def test_tree_time_is_nccls_formula() -> None:
    # 8 machines x 2: latency 2 (1 local + 3 network); 2 S through the NIC at 0.92 x 0.7 (4 MiB).
    expected = 2 * (1e-4 + 3e-3) + 2 * 4 * MiB / (125e6 * 0.92 * 0.7) + 4 * MiB / 1e9
    assert model.tree_time(4 * MiB, 8, 2, HAND) == pytest.approx(expected, rel=1e-12)


def test_bound_is_the_hierarchical_bytes_through_the_nics() -> None:
    assert model.bound_time(MiB, 4, replace(HAND, nics_per_machine=2)) == pytest.approx(1.5 * MiB / 250e6)
    assert model.bound_time(MiB, 1, HAND) == 0.0


@pytest.mark.parametrize("params", [model.EMULATED, model.GPU_CLUSTER, HAND], ids=["emulated", "gpu", "hand"])
def test_the_bound_is_below_every_algorithm(params: model.Params) -> None:
    variants = [
        model.FairringSettings(),
        model.FairringSettings(min_shard=64 * KiB),
        model.FairringSettings(min_shard=64 * KiB, flat_threshold=8 * MiB),
        model.FairringSettings(slice_size=MiB, total_memory=8 * MiB, adaptive=False),
    ]
    for size in model.size_grid(KiB, GiB, per_octave=2):
        for machines in (2, 3, 8, 128):
            for ranks in (1, 2, 8):
                bound = model.bound_time(size, machines, params)
                for settings in variants:
                    assert model.fairring_time(size, machines, ranks, params, settings) >= bound
                assert model.ring_time(size, machines, ranks, params) >= bound
                assert model.ring_time(size, machines, ranks, params, pipelined=True) >= bound
                assert model.tree_time(size, machines, ranks, params) >= bound


def test_fairring_approaches_the_bound_on_a_slow_link() -> None:
    # 1 GiB over 1 Gbit/s: 256 slices of 4 MiB, each far longer on the wire than in the local steps.
    params = model.emulated_params("1gbit")
    time = model.fairring_time(GiB, 2, 2, params, model.FairringSettings())
    assert 1.0 < time / model.bound_time(GiB, 2, params) < 1.02


def test_fewer_slices_in_flight_is_slower() -> None:
    times = []
    for inflight in (1, 2, 4):
        memory = inflight * model.staging_bytes(4 * MiB, 2, 2, padded=False)
        settings = model.FairringSettings(total_memory=memory)
        assert model.plan(64 * MiB, 2, 2, settings).inflight == inflight
        times.append(model.fairring_time(64 * MiB, 2, 2, model.emulated_params("1gbit"), settings))
    assert times[0] > times[1] >= times[2]


def test_below_the_flat_threshold_fairring_is_the_delegate() -> None:
    settings = model.FairringSettings(flat_threshold=MiB)
    params = model.GPU_CLUSTER
    assert model.fairring_time(MiB - 4, 8, 8, params, settings) == model.nccl_time(MiB - 4, 8, 8, params)
    assert model.fairring_time(MiB, 8, 8, params, settings) != model.nccl_time(MiB, 8, 8, params)
    assert model.fairring_time(MiB, 1, 8, params, settings) == model.nccl_time(MiB, 1, 8, params)


# --- the plan mirror -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tensor", "machines", "ranks", "settings", "expected"),
    [
        # docs/benchmarks.md: 64 MiB on 2 x 2 is 16 slices of 4 MiB; 50 MiB of staging holds 8,
        # of which FAIRRING_SLICES_IN_FLIGHT lets 4 fly.
        (64 * MiB, 2, 2, model.FairringSettings(), (4 * MiB, 16, 4 * MiB, MiB, 4, False)),
        (64 * MiB, 2, 2, model.FairringSettings(slices_in_flight=None), (4 * MiB, 16, 4 * MiB, MiB, 8, False)),
        # 8 MiB: cut 8 deep, but not below half of 4 MiB.
        (8 * MiB, 2, 2, model.FairringSettings(), (2 * MiB, 4, 2 * MiB, MiB / 2, 4, False)),
        # The overlap study: a 25 MiB bucket in 8 slices of 3.125 MiB.
        (25 * MiB, 2, 2, model.FairringSettings(slice_size=3276800), (3276800, 8, 3276800, 819200, 4, False)),
        # One slice of 1000 bytes, padded to the unit (2 x 2 x 4 bytes).
        (1000, 2, 2, model.FairringSettings(), (1008, 1, 1008, 252, 4, False)),
        # Unit 24 bytes: 2621441-byte slices round down to 2621424; the 132 left over pad to 144.
        (20 * MiB + 4, 3, 2, model.FairringSettings(), (2621424, 9, 144, 436904, 4, False)),
        # Fixed slices (the slice sweep): 8 MiB even for a 4 MiB tensor, so one slice.
        (
            4 * MiB,
            2,
            2,
            model.FairringSettings(slice_size=8 * MiB, adaptive=False),
            (4 * MiB, 1, 4 * MiB, MiB, 4, False),
        ),
        # The floor at 16 x 8: slices of 16 x 8 x 64 KiB = 8 MiB; 9 MiB of staging each.
        (GiB, 16, 8, model.FairringSettings(min_shard=64 * KiB), (8 * MiB, 128, 8 * MiB, 64 * KiB, 4, False)),
        # At 128 x 8 the floor's 64 MiB slice needs 72 MiB of staging: capped at half of 50 MiB,
        # 9 slots of 2912256 bytes (a multiple of the 4096-byte unit / 8 ranks), two in flight.
        (GiB, 128, 8, model.FairringSettings(min_shard=64 * KiB), (23298048, 47, 2031616, 22752, 2, True)),
    ],
)
def test_plan_follows_the_rules(
    tensor: int, machines: int, ranks: int, settings: model.FairringSettings, expected: tuple
) -> None:
    p = model.plan(tensor, machines, ranks, settings)
    assert (p.slice_bytes, p.slices, p.last_bytes, p.shard_bytes, p.inflight, p.below_floor) == expected
    assert (p.slices - 1) * p.slice_bytes + p.last_bytes >= tensor > (p.slices - 1) * p.slice_bytes


def test_staging_matches_the_layout() -> None:
    # staging.cpp: L + 1 slots of slice / L (64-byte aligned), L more when padded.
    assert model.staging_bytes(4 * MiB, 2, 2, padded=False) == 6 * MiB
    assert model.staging_bytes(4 * MiB, 2, 2, padded=True) == 10 * MiB
    assert model.staging_bytes(100, 2, 2, padded=False) == 3 * 64


def test_the_floor_holds_shards_up_while_staging_allows() -> None:
    floor, ranks = 64 * KiB, 8
    settings = model.FairringSettings(min_shard=floor)
    for machines in range(2, 129):
        p = model.plan(GiB, machines, ranks, settings)
        fits = model.staging_bytes(ranks * machines * floor, ranks, machines, False) <= settings.total_memory // 2
        assert p.below_floor == (not fits)
        if fits:
            assert p.shard_bytes >= floor
        else:  # the slice is as large as half the staging allows
            assert model.staging_bytes(p.slice_bytes, ranks, machines, False) <= settings.total_memory // 2
            bigger = p.slice_bytes + ranks * machines * 4
            assert model.staging_bytes(bigger, ranks, machines, False) > settings.total_memory // 2


def test_without_the_floor_shards_fall_as_one_over_machines() -> None:
    shards = {m: model.plan(GiB, m, 8, model.FairringSettings()).shard_bytes for m in (1, 2, 4, 8, 16, 32, 64, 128)}
    for machines, shard in shards.items():
        assert shard == 4 * MiB / (8 * machines)
    assert shards[128] == 4 * KiB


# --- predictions -----------------------------------------------------------------------------


def test_gpu_crossover_at_8_machines_is_a_few_mib() -> None:
    # The original fairring: NCCL faster up to ~6 MiB at 8 machines, fairring faster from 25 MiB.
    for settings in (model.FairringSettings(), model.FairringSettings(min_shard=model.GPU_MIN_SHARD)):
        crossover = model.crossover(8, 8, model.GPU_CLUSTER, settings)
        assert crossover is not None and MiB <= crossover <= 16 * MiB
    params, settings = model.GPU_CLUSTER, model.FairringSettings()
    assert model.fairring_time(64 * KiB, 8, 8, params, settings) > model.nccl_time(64 * KiB, 8, 8, params)
    assert model.fairring_time(100 * MiB, 8, 8, params, settings) < model.nccl_time(100 * MiB, 8, 8, params)


def test_without_the_floor_fairring_over_shards_at_scale() -> None:
    # 64 buckets of 25 MiB (the original's scaling study): fairring's lead over NCCL peaks near 128
    # GPUs and is lost by 1,024 without the floor; the floor keeps it.
    params, old = model.GPU_CLUSTER, model.FairringSettings()
    floor = replace(old, min_shard=model.GPU_MIN_SHARD)

    def speedup(machines: int, settings: model.FairringSettings) -> float:
        nccl = 64 * model.nccl_time(25 * MiB, machines, 8, params)
        return nccl / model.fairring_time(25 * MiB, machines, 8, params, settings, ops=64)

    assert speedup(16, old) > 1.5
    assert speedup(128, old) < 1.0 < speedup(128, floor)


# --- records and calibration -----------------------------------------------------------------


def test_records_load_with_their_settings(tmp_path: Path) -> None:
    row = {"study": "overlap", "backend": "fairring", "bytes": 25 * MiB, "machines": 2, "ranks_per_machine": 2}
    row |= {"link": "1gbit", "buckets": 64, "inflight": 2, "median_s": 12.8}
    environment = {"fairring_env": {"FAIRRING_SLICE_SIZE": "3276800", "FAIRRING_FLAT_THRESHOLD": "0"}}
    path = tmp_path / "fixed-overlap.json"
    path.write_text(json.dumps({"records": [row], "environment": environment}))
    (record,) = model.load_records([path])
    assert record.per_op_s == pytest.approx(0.2)
    assert record.settings.slice_size == 3276800 and not record.settings.adaptive
    assert model.plan(25 * MiB, 2, 2, record.settings).inflight == 2


def test_records_plan_with_the_shortest_slice_of_their_engine(tmp_path: Path) -> None:
    row = {"study": "single", "backend": "fairring", "bytes": 8 * MiB, "machines": 2, "ranks_per_machine": 2}
    row |= {"link": None, "median_s": 0.01}
    settings = {"FAIRRING_SLICE_SIZE": 4 * MiB, "FAIRRING_SLICES_IN_FLIGHT": 4}
    slices = {}
    for name, environment in {
        "now": {"fairring_settings": settings, "fairring_plan": {"shortest_slice": 2 * MiB}},
        "before": {"fairring_settings": settings},  # engines before 775dc7a: a quarter
    }.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"records": [row], "environment": environment}))
        (record,) = model.load_records([path])
        slices[name] = model.plan(8 * MiB, 2, 2, record.settings).slices
    assert slices == {"now": 4, "before": 8}


def _synthetic(truth: model.Params, link: str) -> list[model.Record]:
    records = []
    for machines in (1, 2, 4):
        for ranks in (2, 4):
            for size in model.size_grid(4 * KiB, 256 * MiB, per_octave=0.5):
                for backend in ("gloo", "fairring"):
                    settings = model.FairringSettings()
                    record = model.Record(
                        "synthetic", "single", backend, size, machines, ranks, link, 1, None, 0.0, settings
                    )
                    records.append(replace(record, median_s=model.model_time(record, truth)))
    return records


def test_calibration_recovers_known_parameters() -> None:
    # A fast link, so that the local steps (and so local_Bps and reduce_Bps apart) show.
    link = "100gbit"
    start = model.emulated_params(link)
    truth = replace(start, alpha_s=2e-4, local_alpha_s=5e-5, slice_cpu_s=1e-4, local_Bps=3e9, reduce_Bps=1.5e9)
    rng = np.random.default_rng(7)
    records = [replace(r, median_s=r.median_s * math.exp(rng.normal(0, 0.02))) for r in _synthetic(truth, link)]
    fitted = model.calibrate(records)
    for name in model.FITTED:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.15), name
    assert fitted.link_Bps == truth.link_Bps  # fixed by the link
    assert np.sqrt(np.mean(model.residuals(records, fitted) ** 2)) < 0.03


def test_calibration_takes_one_link_setting() -> None:
    records = _synthetic(model.EMULATED, "1gbit")[:2] + _synthetic(model.EMULATED, "10gbit")[:2]
    with pytest.raises(ValueError, match="one link setting"):
        model.calibrate(records)
