"""The engine's reduce-scatter and all-gather (reduce_scatter_tensor, all_gather_into_tensor).

Every expected value is a plain torch computation of the known per-rank inputs
(benchmarks/reference.py). Each check also asserts that the op ran on the engine (its
op count grows), so a silent fall back to Gloo cannot pass for the Herring path.
Sizes run from one element per rank through several slices (FAIRRING_SLICE_SIZE
is small here) to sizes that are a multiple of nothing convenient, on layouts
whose ranks are numbered by machine and interleaved, with shared-memory and
Gloo local steps, and on the emulated device in launch-order mode.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import fairring
from benchmarks.harness import InitSpec, Layout, RankPool
from benchmarks.reference import (
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


def by_collective() -> dict[str, dict[str, int]]:
    """The engine's ops and bytes per collective kind (none before it is made)."""
    stats = fairring.backend_of(dist.group.WORLD).engine_stats("cpu")
    return stats["by_collective"] if stats else {kind: {"ops": 0, "bytes": 0} for kind in ENGINE_KINDS}


ENGINE_KINDS = ("all_reduce", "reduce_scatter", "all_gather")


def reduce_scatter_matches(chunk_numel: int, dtype_name: str, op: str, seed: int) -> None:
    """One reduce-scatter against plain torch, on the engine (bitwise ops too: CPU tensors)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, dtype_name)
    shape = (world * chunk_numel,)
    inputs = [rank_tensor(r, shape, dtype, seed, op) for r in range(world)]
    output = torch.full((chunk_numel,), 77, dtype=dtype)
    before = engine_ops()
    dist.reduce_scatter_tensor(output, inputs[rank].clone(), op=REDUCE_OPS[op])
    assert engine_ops() == before + 1, f"the reduce-scatter ({op}) did not run on the engine"
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


def two_groups_on_two_threads(seed: int) -> None:
    """Each thread its own fairring group, many of both collectives in flight on each, then all waited."""
    import threading

    world, rank = dist.get_world_size(), dist.get_rank()
    # The new group's engine and layout are made by its first op, on its thread, while the other
    # thread's ops run: both setups share this process's store client (fairring/_shared_memory.py).
    groups = [dist.group.WORLD, dist.new_group(backend="fairring")]
    failures: list[BaseException] = []

    def issue(group: dist.ProcessGroup, offset: int) -> None:
        try:
            chunk = 5003 + offset
            inputs = [[rank_tensor(r, (world * chunk,), torch.float32, seed + offset + i) for r in range(world)]
                      for i in range(6)]  # fmt: skip
            outputs = [torch.empty(chunk) for _ in inputs]
            gathered = [torch.empty(world * chunk) for _ in inputs]
            works = []
            for i, every in enumerate(inputs):
                works.append(dist.reduce_scatter_tensor(outputs[i], every[rank], group=group, async_op=True))
                mine = every[rank].view(world, chunk)[rank]
                works.append(dist.all_gather_into_tensor(gathered[i], mine, group=group, async_op=True))
            for work in works:
                work.wait()
            for i, every in enumerate(inputs):
                expected = torch.stack(every).double().sum(0).view(world, chunk)[rank].float()
                torch.testing.assert_close(outputs[i], expected, rtol=1e-5, atol=1e-5)
                assert torch.equal(gathered[i], torch.cat([t.view(world, chunk)[r] for r, t in enumerate(every)]))
        except BaseException as error:  # re-raised on the main thread
            failures.append(error)

    threads = [threading.Thread(target=issue, args=(group, 7 * i)) for i, group in enumerate(groups)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=200)
    assert not any(thread.is_alive() for thread in threads), "a thread's collectives did not finish"
    if failures:
        raise failures[0]
    dist.destroy_process_group(groups[1])


def in_place(seed: int) -> None:
    """FSDP2's all-gather into the buffer its input is a view of, and a reduce-scatter into its own input."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunk = 30_001
    shards = [rank_tensor(r, (chunk,), torch.float32, seed) for r in range(world)]
    gathered = torch.zeros(world * chunk)
    gathered.narrow(0, rank * chunk, chunk).copy_(shards[rank])
    before = engine_ops()
    counted = by_collective()
    dist.all_gather_into_tensor(gathered, gathered.narrow(0, rank * chunk, chunk))
    assert torch.equal(gathered, torch.cat(shards))
    inputs = [rank_tensor(r, (world * chunk,), torch.float32, seed + 1) for r in range(world)]
    buffer = inputs[rank].clone()
    dist.reduce_scatter_tensor(buffer.narrow(0, rank * chunk, chunk), buffer)
    expected = reduce_reference(inputs, "sum").view(world, chunk)[rank].float()
    torch.testing.assert_close(buffer.narrow(0, rank * chunk, chunk), expected, rtol=1e-5, atol=1e-5)
    assert engine_ops() == before + 2
    now = by_collective()
    for kind in ("reduce_scatter", "all_gather"):  # one each, of world x chunk float32s
        assert now[kind]["ops"] - counted[kind]["ops"] == 1, kind
        assert now[kind]["bytes"] - counted[kind]["bytes"] == world * chunk * 4, kind
    assert now["all_reduce"] == counted["all_reduce"]


def every_form(seed: int) -> None:
    """The list and coalesced forms, each one engine op, against plain torch; chunk sizes of no common factor."""
    world, rank = dist.get_world_size(), dist.get_rank()
    shapes = [(3, 7), (1,), (40_003,)]
    # reduce_scatter: a list of N inputs shaped as the output.
    for i, shape in enumerate(shapes):
        lists = [
            [rank_tensor(r, shape, torch.float32, seed + i * world + c) for c in range(world)] for r in range(world)
        ]
        output = torch.full(shape, 77.0)
        before = engine_ops()
        dist.reduce_scatter(output, [t.clone() for t in lists[rank]])
        assert engine_ops() == before + 1, "the list reduce-scatter did not run on the engine"
        expected = reduce_reference([lists[r][rank] for r in range(world)], "sum")
        torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    # all_gather: a list of N outputs shaped as the input.
    for i, shape in enumerate(shapes):
        chunks = [rank_tensor(r, shape, torch.int32, seed + i) for r in range(world)]
        outputs = [torch.full(shape, 77, dtype=torch.int32) for _ in range(world)]
        before = engine_ops()
        dist.all_gather(outputs, chunks[rank].clone())
        assert engine_ops() == before + 1, "the list all-gather did not run on the engine"
        for got, want in zip(outputs, chunks, strict=True):
            assert torch.equal(got, want)
    # Coalesced: the coalescing manager's fast path, several pairs as one op, in place for the all-gathers.
    numels = [1, 5, 40_003]
    inputs = [
        [rank_tensor(r, (world * n,), torch.bfloat16, seed + j) for j, n in enumerate(numels)] for r in range(world)
    ]
    outputs = [torch.full((n,), 77.0, dtype=torch.bfloat16) for n in numels]
    gathered = [torch.zeros(world * n, dtype=torch.bfloat16) for n in numels]
    shards = [rank_tensor(rank, (n,), torch.bfloat16, seed + 9 + j) for j, n in enumerate(numels)]
    for buffer, shard in zip(gathered, shards, strict=True):
        buffer.view(world, -1)[rank].copy_(shard)
    before = engine_ops()
    with dist._coalescing_manager(async_ops=True) as manager:
        for output, tensor in zip(outputs, inputs[rank], strict=True):
            dist.reduce_scatter_tensor(output, tensor.clone(), op=dist.ReduceOp.MAX)
    manager.wait()
    with dist._coalescing_manager(async_ops=True) as manager:
        for buffer in gathered:
            dist.all_gather_into_tensor(buffer, buffer.view(world, -1)[rank])
    manager.wait()
    assert engine_ops() == before + 2, "each coalesced block was not one engine op"
    for j, n in enumerate(numels):
        expected = reduce_reference([inputs[r][j] for r in range(world)], "max").view(world, n)[rank]
        assert torch.equal(outputs[j], expected)
        every = [rank_tensor(r, (n,), torch.bfloat16, seed + 9 + j) for r in range(world)]
        assert torch.equal(gathered[j], torch.cat(every))


def premultiplied_sums(seed: int) -> None:
    """PREMUL_SUM, each rank its own factor (a number, then a tensor): on the engine, and on Gloo (a strided input)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunk = 1001
    inputs = [rank_tensor(r, (world * chunk,), torch.float32, seed) for r in range(world)]
    expected = sum((r + 2) * inputs[r].double() for r in range(world)).view(world, chunk)[rank].float()
    factors = [float(rank + 2), torch.tensor([float(rank + 2)])]
    for factor in factors:
        premul = dist._make_nccl_premul_sum(factor)
        output = torch.empty(chunk)
        before = engine_ops()
        dist.reduce_scatter_tensor(output, inputs[rank].clone(), op=premul)
        assert engine_ops() == before + 1, "the PREMUL_SUM did not run on the engine"
        torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
        strided = torch.zeros(2 * world * chunk)
        strided[::2] = inputs[rank]
        output = torch.empty(chunk)
        dist.reduce_scatter_tensor(output, strided[::2], op=premul)
        assert engine_ops() == before + 1, "a strided input ran on the engine"
        torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    integers = torch.ones(world, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="PREMUL_SUM needs a floating-point tensor"):
        dist.reduce_scatter_tensor(torch.empty(1, dtype=torch.int32), integers, op=dist._make_nccl_premul_sum(2.0))


def outcome(call) -> object:  # type: ignore[no-untyped-def]
    """What `call` returns, or the class of what it raises."""
    try:
        return call()
    except Exception as error:
        return type(error).__name__


def delegated_where_the_engine_cannot(seed: int) -> None:
    """Non-contiguous tensors go to Gloo: fairring gives what Gloo itself gives."""
    world, rank = dist.get_world_size(), dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    strided = rank_tensor(rank, (2 * world * 8,), torch.float32, seed)[::2]

    def gather(group: dist.ProcessGroup | None) -> object:
        output = torch.zeros(world * 8)
        dist.all_gather_into_tensor(output, strided[:8], group=group)
        return output

    def scatter(group: dist.ProcessGroup | None) -> object:
        output = torch.zeros(world * 8)[::world]
        dist.reduce_scatter_tensor(output, strided, group=group)
        return output

    before = engine_ops()
    for call in (gather, scatter):
        ours, theirs = outcome(lambda call=call: call(None)), outcome(lambda call=call: call(gloo))
        if isinstance(theirs, torch.Tensor):
            assert isinstance(ours, torch.Tensor) and torch.equal(ours, theirs), (ours, theirs)
        else:
            assert not isinstance(ours, torch.Tensor), f"Gloo raised {theirs}; fairring returned"
    assert engine_ops() == before, "the engine took a tensor it cannot"
    dist.destroy_process_group(gloo)


# 4x2 (8 processes on CI's 2 cores) is in the extended tier (`make test-extended`); the others cover
# several machines of several ranks, interleaved and not, in CI.
LAYOUTS = [
    Layout(2, 2),
    Layout(3, 2, interleaved=True),
    Layout(2, 3),
    pytest.param(Layout(4, 2), marks=pytest.mark.extended),
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
def test_two_groups_on_two_threads(pool: RankPool) -> None:
    pool.run(two_groups_on_two_threads, 30)


@pytest.mark.timeout(300)
def test_in_place(pool: RankPool) -> None:
    pool.run(in_place, 27)


@pytest.mark.timeout(300)
def test_list_and_coalesced_forms(pool: RankPool) -> None:
    pool.run(every_form, 28)


@pytest.mark.timeout(300)
def test_premultiplied_sums(pool: RankPool) -> None:
    pool.run(premultiplied_sums, 29)


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
        ranks.run(every_form, 31)
        ranks.run(premultiplied_sums, 32)
