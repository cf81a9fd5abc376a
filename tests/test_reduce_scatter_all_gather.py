"""The engine's reduce-scatter and all-gather (reduce_scatter_tensor, all_gather_into_tensor).

Every expected value is a plain torch computation of the known per-rank inputs
(tests/reference.py). Each check also asserts that the op ran on the engine (its
op count grows), so a silent fall back to Gloo cannot pass for the Herring path.
Sizes run from one element per rank through several slices (FAIRRING_SLICE_SIZE
is small here) to sizes that are a multiple of nothing convenient, on layouts
whose ranks are numbered by machine and interleaved, with shared-memory and
Gloo local steps, and on the emulated device in launch-order mode.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import fairring
from harness import InitSpec, Layout, RankPool
from reference import (
    ARITHMETIC_OPS,
    BITWISE_OPS,
    FLOAT_DTYPES,
    INT_DTYPES,
    REDUCE_OPS,
    TOLERANCES,
    assert_matches,
    rank_tensor,
    reduce_reference,
)

# One element per rank; fewer than a shard; one slice; several, the last padded.
CHUNK_NUMELS = [1, 5, 1000, 40_003]
SMALL_SLICES = {"FAIRRING_SLICE_SIZE": "64KiB"}
DTYPES = [*FLOAT_DTYPES, *INT_DTYPES]


def engine_ops() -> int:
    stats = fairring.backend_of(dist.group.WORLD).engine_stats("cpu") or {}
    return int(stats.get("ops", 0))


def reduce_scatter_matches(chunk_numel: int, dtype_name: str, op: str, seed: int) -> None:
    """One reduce-scatter against plain torch; on the engine unless a bitwise op (Gloo's, for now)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, dtype_name)
    shape = (world * chunk_numel,)
    inputs = [rank_tensor(r, shape, dtype, seed, op) for r in range(world)]
    output = torch.full((chunk_numel,), 77, dtype=dtype)
    before = engine_ops()
    dist.reduce_scatter_tensor(output, inputs[rank].clone(), op=REDUCE_OPS[op])
    on_engine = op not in BITWISE_OPS
    assert engine_ops() == before + on_engine, f"the reduce-scatter ({op}) ran on the wrong path"
    expected = reduce_reference(inputs, op).view(world, chunk_numel)[rank]
    assert_matches(output, expected)


def all_gather_matches(chunk_numel: int, dtype_name: str, seed: int) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, dtype_name)
    chunks = [rank_tensor(r, (chunk_numel,), dtype, seed) for r in range(world)]
    output = torch.full((world * chunk_numel,), 77, dtype=dtype)
    before = engine_ops()
    dist.all_gather_into_tensor(output, chunks[rank].clone())
    assert engine_ops() == before + 1, "the all-gather did not run on the engine"
    assert torch.equal(output, torch.cat(chunks))


def every_case(seed: int, full: bool) -> None:
    """Every size, dtype and op the engine takes, one at a time; `full=False`: the extremes only."""
    numels = CHUNK_NUMELS if full else [CHUNK_NUMELS[0], CHUNK_NUMELS[-1]]
    dtypes = DTYPES if full else ["float32", "bfloat16", "int32"]
    for chunk_numel in numels:
        for dtype in dtypes:
            all_gather_matches(chunk_numel, dtype, seed)
            ops = ARITHMETIC_OPS + (BITWISE_OPS if dtype in INT_DTYPES else ())
            for op in ops:
                if op == "product" and chunk_numel > 1000:
                    continue  # products of many ranks' values: one size shows the op
                reduce_scatter_matches(chunk_numel, dtype, op, seed)
    for dtype in FLOAT_DTYPES:
        world, rank = dist.get_world_size(), dist.get_rank()
        inputs = [rank_tensor(r, (world * 1000,), getattr(torch, dtype), seed) for r in range(world)]
        output = torch.empty(1000, dtype=getattr(torch, dtype))
        dist.reduce_scatter_tensor(output, inputs[rank].clone(), op=dist.ReduceOp.AVG)
        expected = (reduce_reference(inputs, "sum") / world).view(world, 1000)[rank]
        torch.testing.assert_close(output, expected.to(output.dtype), **TOLERANCES.get(output.dtype, {}))


def many_in_flight(seed: int) -> None:
    """FSDP's pattern: several of each in flight at once, views of shared buffers, then waited."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunk = 20_011
    grads = [rank_tensor(r, (4 * world * chunk,), torch.float32, seed) for r in range(world)]
    mine = grads[rank].clone()
    reduced = torch.empty(4 * chunk)
    params = torch.empty(4 * world * chunk)
    shards = rank_tensor(rank, (4 * chunk,), torch.float32, seed + 1)
    works = []
    for i in range(4):
        bucket = mine.narrow(0, i * world * chunk, world * chunk)
        works.append(dist.reduce_scatter_tensor(reduced.narrow(0, i * chunk, chunk), bucket, async_op=True))
        gathered = params.narrow(0, i * world * chunk, world * chunk)
        works.append(dist.all_gather_into_tensor(gathered, shards.narrow(0, i * chunk, chunk), async_op=True))
    for work in works:
        work.wait()
    total = reduce_reference(grads, "sum")
    for i in range(4):
        bucket = total.narrow(0, i * world * chunk, world * chunk).view(world, chunk)[rank]
        torch.testing.assert_close(reduced.narrow(0, i * chunk, chunk), bucket.float(), rtol=1e-5, atol=1e-5)
        every = [
            rank_tensor(r, (4 * chunk,), torch.float32, seed + 1).narrow(0, i * chunk, chunk) for r in range(world)
        ]
        assert torch.equal(params.narrow(0, i * world * chunk, world * chunk), torch.cat(every))


def in_place(seed: int) -> None:
    """FSDP2's all-gather into the buffer its input is a view of, and a reduce-scatter into its own input."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunk = 30_001
    shards = [rank_tensor(r, (chunk,), torch.float32, seed) for r in range(world)]
    gathered = torch.zeros(world * chunk)
    gathered.narrow(0, rank * chunk, chunk).copy_(shards[rank])
    before = engine_ops()
    dist.all_gather_into_tensor(gathered, gathered.narrow(0, rank * chunk, chunk))
    assert torch.equal(gathered, torch.cat(shards))
    inputs = [rank_tensor(r, (world * chunk,), torch.float32, seed + 1) for r in range(world)]
    buffer = inputs[rank].clone()
    dist.reduce_scatter_tensor(buffer.narrow(0, rank * chunk, chunk), buffer)
    expected = reduce_reference(inputs, "sum").view(world, chunk)[rank].float()
    torch.testing.assert_close(buffer.narrow(0, rank * chunk, chunk), expected, rtol=1e-5, atol=1e-5)
    assert engine_ops() == before + 2


def outcome(call) -> object:  # type: ignore[no-untyped-def]
    """What `call` returns, or the class of what it raises."""
    try:
        return call()
    except Exception as error:
        return type(error).__name__


def delegated_where_the_engine_cannot(seed: int) -> None:
    """Non-contiguous tensors and PREMUL_SUM go to Gloo: fairring gives what Gloo itself gives."""
    world, rank = dist.get_world_size(), dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    strided = rank_tensor(rank, (2 * world * 8,), torch.float32, seed)[::2]
    premul = dist._make_nccl_premul_sum(2.0)

    def gather(group: dist.ProcessGroup | None) -> object:
        output = torch.zeros(world * 8)
        dist.all_gather_into_tensor(output, strided[:8], group=group)
        return output

    def scatter(group: dist.ProcessGroup | None, op: dist.ReduceOp = dist.ReduceOp.SUM) -> object:
        output = torch.zeros(world * 8)[::world]
        dist.reduce_scatter_tensor(output, strided, op=op, group=group)
        return output

    before = engine_ops()
    for call in (gather, scatter, lambda group: scatter(group, premul)):
        ours, theirs = outcome(lambda call=call: call(None)), outcome(lambda call=call: call(gloo))
        if isinstance(theirs, torch.Tensor):
            assert isinstance(ours, torch.Tensor) and torch.equal(ours, theirs), (ours, theirs)
        else:
            assert not isinstance(ours, torch.Tensor), f"Gloo raised {theirs}; fairring returned"
    assert engine_ops() == before, "the engine took a tensor it cannot"
    dist.destroy_process_group(gloo)


# 4x2 (8 processes on CI's 2 cores) runs outside CI: `make test-collective-layouts`.
ALL_LAYOUTS = os.environ.get("FAIRRING_TEST_ALL_LAYOUTS") == "1"
LAYOUTS = [
    Layout(2, 2),
    Layout(3, 2, interleaved=True),
    Layout(2, 3),
    pytest.param(
        Layout(4, 2),
        marks=pytest.mark.skipif(not ALL_LAYOUTS, reason="8 ranks: make test-collective-layouts runs it"),
    ),
]


@pytest.fixture(scope="module", params=LAYOUTS, ids=str)
def pool(request: pytest.FixtureRequest) -> Iterator[RankPool]:
    with RankPool(request.param, InitSpec(extra_env=SMALL_SLICES)) as ranks:
        yield ranks


@pytest.mark.timeout(600)
def test_every_size_dtype_and_op(pool: RankPool) -> None:
    # Every case on the two 2-rank-per-machine layouts; the larger ones repeat the extremes.
    full = pool.layout.ranks_per_machine == 2 and pool.layout.machines <= 3
    pool.run(every_case, 21, full, timeout=500)


@pytest.mark.timeout(300)
def test_many_in_flight_on_views(pool: RankPool) -> None:
    pool.run(many_in_flight, 22)


@pytest.mark.timeout(300)
def test_in_place(pool: RankPool) -> None:
    pool.run(in_place, 27)


@pytest.mark.timeout(300)
def test_delegated_where_the_engine_cannot(pool: RankPool) -> None:
    pool.run(delegated_where_the_engine_cannot, 23)


@pytest.mark.timeout(600)
def test_local_steps_as_real_groups_on_the_emulated_device() -> None:
    """Gloo groups as the local steps, on a device whose streams progress on their own, in launch order."""
    env = {"FAIRRING_TEST_EMULATED_DEVICE": "seed=3", "FAIRRING_SHM_DISABLE": "1"}
    with RankPool(Layout(2, 2), InitSpec(extra_env={**SMALL_SLICES, **env})) as ranks:
        ranks.run(many_in_flight, 24)
        ranks.run(reduce_scatter_matches, 40_003, "float32", "sum", 25)
        ranks.run(all_gather_matches, 40_003, "bfloat16", 26)
