"""The Herring engine at work: slicing, staging bounds, overlap and DDP, against references (its plans' arithmetic
on its own: test_plans.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import InitSpec, Layout, RankPool
from benchmarks.reference import REDUCE_OPS, all_ranks_reduced, assert_matches, rank_tensor
from fairring import _C
from scenarios import make_engine, shutdown_with_an_op_in_flight


def cpu_backend() -> _C.Backend:
    return dist.group.WORLD._get_backend(torch.device("cpu"))


def cuda_engine_stats() -> tuple[object, object, str]:
    try:
        cpu_backend().engine_stats("gpu")
    except RuntimeError as error:
        message = str(error)
    else:
        message = "no error"
    return cpu_backend().engine_stats("cuda"), cpu_backend().staging_stats(device="cuda"), message


def test_no_cuda_engine_without_cuda_all_reduces(pool: RankPool) -> None:
    for stats, staging, bad_device in pool.run(cuda_engine_stats):
        assert stats is None and staging is None
        assert "device must be 'cpu' or 'cuda', not 'gpu'" in bad_device


def sum_and_stats(numel: int, count: int) -> tuple[dict[str, int], dict[str, int]]:
    rank = dist.get_rank()
    for seed in range(count):
        tensor = rank_tensor(rank, (numel,), torch.float32, seed=seed)
        dist.all_reduce(tensor)
        assert_matches(tensor, all_ranks_reduced((numel,), torch.float32, seed=seed))
    return cpu_backend().engine_stats(), cpu_backend().staging_stats()


def test_engine_runs_when_machines_are_several(pool: RankPool) -> None:
    results = pool.run(sum_and_stats, 10_000, 1)
    for stats, staging in results:
        if pool.layout.machines == 1:
            assert stats is None and staging is None  # nothing crosses machines: delegated
            continue
        assert stats["slices"] >= 1
        # Each rank sends (M - 1) shards of its slot out and its reduced shard back.
        assert stats["rail_bytes_sent"] > 0 and stats["rail_bytes_received"] == stats["rail_bytes_sent"]


def small_then_large() -> list[dict[str, int]]:
    """Engine counters before, after a 4 KB and after a 400 KB all-reduce."""
    rank = dist.get_rank()
    counters = [cpu_backend().engine_stats()]
    assert counters[0] is None  # no engine until an all-reduce needs it
    for seed, numel in enumerate((100_000, 1_000, 100_000)):
        tensor = rank_tensor(rank, (numel,), torch.float32, seed=seed)
        dist.all_reduce(tensor)
        assert_matches(tensor, all_ranks_reduced((numel,), torch.float32, seed=seed))
        counters.append(cpu_backend().engine_stats())
    return counters


def test_all_reduces_below_the_flat_threshold_skip_the_herring_path() -> None:
    spec = InitSpec(extra_env={"FAIRRING_FLAT_THRESHOLD": "64KiB"})
    with RankPool(Layout(2, 2), spec) as ranks:
        results = ranks.run(small_then_large)
    for _, before, after_small, after_large in results:
        assert after_small["flat_ops"] == before["flat_ops"] + 1
        assert after_small["slices"] == before["slices"]
        assert after_large["slices"] > after_small["slices"]
        assert after_large["flat_ops"] == after_small["flat_ops"]


# No shard floor: slices stay at 4 KiB instead of growing to what 12 KiB holds twice.
STREAMING_ENV = {"FAIRRING_SLICE_SIZE": "4KiB", "FAIRRING_TOTAL_MEMORY": "12KiB", "FAIRRING_MIN_SHARD_SIZE": "0"}


@pytest.mark.parametrize("layout", [Layout(2, 2), Layout(3, 1), Layout(2, 3, interleaved=True)], ids=str)
def test_tensors_far_larger_than_staging_stream_through_it(layout: Layout) -> None:
    with RankPool(layout, InitSpec(extra_env=STREAMING_ENV)) as ranks:
        results = ranks.run(sum_and_stats, 300_001, 3)
    for stats, staging in results:
        assert staging["capacity_bytes"] <= 12 * 1024
        assert 0 < staging["peak_bytes_in_use"] <= staging["capacity_bytes"]
        assert staging["peak_leases_in_use"] >= 1
        assert staging["bytes_in_use"] == 0 and staging["leases_in_use"] == 0
        # 1.2 MB per op through 12 KiB of staging: hundreds of slices.
        assert stats["slices"] >= 3 * (300_001 * 4 // 4096)


@pytest.mark.parametrize("cap", [1, 2])
def test_slices_in_flight_are_capped_and_every_slice_still_fits(cap: int) -> None:
    """The staging shrinks to `cap` full slices, yet a padded last slice (larger) still fits."""
    env = {"FAIRRING_SLICE_SIZE": "4KiB", "FAIRRING_MIN_SHARD_SIZE": "0", "FAIRRING_SLICES_IN_FLIGHT": str(cap)}
    with RankPool(Layout(2, 2), InitSpec(extra_env=env)) as ranks:
        results = ranks.run(sum_and_stats, 300_001, 2)  # 300,001 elements: the last slice is padded
    full = _C.staging_bytes_for(4096, 2, 2, padded=False)
    padded = _C.staging_bytes_for(4096, 2, 2, padded=True)
    for stats, staging in results:
        assert staging["peak_leases_in_use"] == cap
        assert padded <= staging["capacity_bytes"] <= max(cap * full, padded)
        assert stats["slices"] >= 2 * (300_001 * 4 // 4096)


def mixed_ops_in_flight() -> None:
    rank = dist.get_rank()
    kinds = [("float32", "sum"), ("float64", "max"), ("int32", "min"), ("bfloat16", "sum"), ("int64", "product")]
    cases = [(shape, dtype, op) for shape in [(1,), (5, 7), (4096,), (100_003,)] for dtype, op in kinds]
    tensors, works = [], []
    for seed, (shape, dtype, op) in enumerate(cases):
        tensor = rank_tensor(rank, shape, getattr(torch, dtype), seed, op)
        tensors.append(tensor)
        works.append(dist.all_reduce(tensor, op=REDUCE_OPS[op], async_op=True))
    for work in works:
        work.wait()
    for seed, ((shape, dtype, op), tensor) in enumerate(zip(cases, tensors, strict=True)):
        assert_matches(tensor, all_ranks_reduced(shape, getattr(torch, dtype), op, seed))


def test_mixed_sizes_dtypes_and_ops_in_flight(pool: RankPool) -> None:
    pool.run(mixed_ops_in_flight)


def rank_dependent_waiting() -> None:
    """Rank 0 waits for each op before issuing the next; the others issue all at once.

    Legal under c10d (same order, any timing). A rank that is ahead must not
    block one that is behind, whatever the staging bound.
    """
    rank = dist.get_rank()
    tensors = [rank_tensor(rank, (50_000,), torch.float32, seed=s) for s in range(6)]
    works = []
    for tensor in tensors:
        works.append(dist.all_reduce(tensor, async_op=True))
        if rank == 0:
            works[-1].wait()
    for work in works:
        work.wait()
    for seed, tensor in enumerate(tensors):
        assert_matches(tensor, all_ranks_reduced((50_000,), torch.float32, seed=seed))


def test_ranks_that_wait_at_different_points_do_not_deadlock() -> None:
    with RankPool(Layout(2, 2), InitSpec(extra_env=STREAMING_ENV)) as ranks:
        ranks.run(rank_dependent_waiting, timeout=90)


def non_contiguous_tensor() -> None:
    rank = dist.get_rank()
    base = rank_tensor(rank, (64, 30), torch.float32)
    view = base.t()  # not contiguous
    dist.all_reduce(view)
    assert_matches(base, all_ranks_reduced((64, 30), torch.float32))


def test_non_contiguous_tensor(pool: RankPool) -> None:
    pool.run(non_contiguous_tensor)


def ddp_parity(steps: int, hook: str) -> float:
    """Trains the same model under fairring and under Gloo; returns the largest parameter gap."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")

    def make_model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

    models = {"fairring": DDP(make_model(), bucket_cap_mb=0.05), "gloo": DDP(make_model(), process_group=gloo)}
    if hook == "bf16_compress":
        for name, model in models.items():
            group = gloo if name == "gloo" else dist.group.WORLD
            model.register_comm_hook(group, default_hooks.bf16_compress_hook)
    optimizers = {name: torch.optim.SGD(model.parameters(), lr=0.05) for name, model in models.items()}
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        inputs = torch.randn(16, 32, generator=data)
        targets = torch.randint(0, 10, (16,), generator=data)
        for name, model in models.items():
            optimizers[name].zero_grad()
            torch.nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizers[name].step()
    gaps = [
        (a - b).abs().max().item()
        for a, b in zip(models["fairring"].parameters(), models["gloo"].parameters(), strict=True)
    ]
    dist.destroy_process_group(gloo)
    return max(gaps)


@pytest.mark.parametrize("hook", ["none", "bf16_compress"])
def test_ddp_matches_gloo(hook: str) -> None:
    with RankPool(Layout(2, 2)) as ranks:
        gaps = ranks.run(ddp_parity, 60, hook, timeout=240)
    # Summation order differs from Gloo's: allow float rounding, not more
    # (measured gaps over 200 steps: 3e-8 without a hook, 2e-4 with bf16
    # compression; 60 steps keep CI's time, and a wrong sum shows at once).
    tolerance = 1e-6 if hook == "none" else 5e-3
    assert max(gaps) < tolerance, gaps


def coalescing_block() -> tuple[int, int]:
    """Engine all-reduces and a Gloo broadcast in one raw coalescing block; one Work for all."""
    rank = dist.get_rank()
    group = dist.group.WORLD
    device = torch.device("cpu")
    large = rank_tensor(rank, (10_000,), torch.float32, seed=1)
    tiny = rank_tensor(rank, (3,), torch.float32, seed=2)
    broadcast = torch.full((5,), float(rank))
    make_engine("cpu")  # outside the block: the engine connects at the group's first all-reduce
    ops_before = cpu_backend().engine_stats()["ops"]
    group._start_coalescing(device)
    dist.all_reduce(large, async_op=True)
    dist.all_reduce(tiny, async_op=True)
    dist.broadcast(broadcast, src=0, async_op=True)
    work = group._end_coalescing(device)
    work.wait()
    assert_matches(large, all_ranks_reduced((10_000,), torch.float32, seed=1))
    assert_matches(tiny, all_ranks_reduced((3,), torch.float32, seed=2))
    assert_matches(broadcast, torch.zeros(5))
    return ops_before, cpu_backend().engine_stats()["ops"]


def test_engine_all_reduces_join_a_coalescing_block() -> None:
    with RankPool(Layout(2, 2)) as ranks:
        for before, after in ranks.run(coalescing_block):
            assert after == before + 2  # both all-reduces ran on the engine, inside the block


def test_destroying_the_group_fails_engine_ops_in_flight_and_returns() -> None:
    with RankPool(Layout(2, 1)) as ranks:
        (elapsed, error), _ = ranks.run(shutdown_with_an_op_in_flight, "cpu", timeout=60)
    assert elapsed < 5, elapsed
    assert "rank 0 (machine 0 of 2) shut down its process group" in error, error
