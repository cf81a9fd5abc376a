"""Collectives in flight on the same memory run in issue order, as NCCL runs a group's collectives.

Every expected value is computed from the known per-rank inputs with plain torch.
The negative control turns the ordering off and shows that the first test then
sees wrong results: without it, the second all-reduce reads its input before
the first has written its result back. A second one hands out Gloo's
reduce-scatter Work as Gloo made it, and shows the stale copy and the leak
that fairring's wrapper of it prevents.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import InitSpec, Layout, RankPool
from benchmarks.reference import all_ranks_reduced, assert_matches, rank_tensor

# 64 Ki floats travel as one slice, 1 Mi + 3 as several with a padded last one.
NUMELS = [1 << 16, (1 << 20) + 3]


@pytest.fixture(scope="module", params=[Layout(2, 2), Layout(3, 2, interleaved=True)], ids=str)
def ordered_pool(request: pytest.FixtureRequest) -> Iterator[RankPool]:
    with RankPool(request.param) as ranks:
        yield ranks


def twice_in_flight(numel: int, seed: int) -> bool:
    """all_reduce(t) twice without waiting: world_size times the sum. Whether it matched."""
    world = dist.get_world_size()
    tensor = rank_tensor(dist.get_rank(), (numel,), torch.float32, seed)
    first = dist.all_reduce(tensor, async_op=True)
    second = dist.all_reduce(tensor, async_op=True)
    second.wait()
    first.wait()
    expected = all_ranks_reduced((numel,), torch.float32, seed=seed) * world
    return torch.allclose(tensor, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.timeout(300)
def test_same_tensor_twice(ordered_pool: RankPool) -> None:
    for seed, numel in enumerate(NUMELS):
        assert all(ordered_pool.run(twice_in_flight, numel, seed)), f"{numel} floats"


def overlapping_views(numel: int, seed: int) -> None:
    """all_reduce of t[: 3n/4] and of t[n/4 :] in flight together: the overlap is reduced twice."""
    world = dist.get_world_size()
    tensor = rank_tensor(dist.get_rank(), (numel,), torch.float32, seed)
    reference = all_ranks_reduced((numel,), torch.float32, seed=seed)
    head, tail = tensor[: 3 * numel // 4], tensor[numel // 4 :]
    works = [dist.all_reduce(head, async_op=True), dist.all_reduce(tail, async_op=True)]
    for work in works:
        work.wait()
    expected = reference.clone()
    expected[numel // 4 : 3 * numel // 4] *= world
    assert_matches(tensor, expected)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("numel", NUMELS)
def test_overlapping_views(ordered_pool: RankPool, numel: int) -> None:
    ordered_pool.run(overlapping_views, numel, 5)


def disjoint_views_of_one_buffer(numel: int, seed: int) -> None:
    """Buckets of one gradient buffer (as Megatron's DDP has them) are each reduced once."""
    tensor = rank_tensor(dist.get_rank(), (4 * numel,), torch.float32, seed)
    works = [dist.all_reduce(bucket, async_op=True) for bucket in tensor.chunk(4)]
    for work in works:
        work.wait()
    assert_matches(tensor, all_ranks_reduced((4 * numel,), torch.float32, seed=seed))


@pytest.mark.timeout(300)
def test_disjoint_views_of_one_buffer(ordered_pool: RankPool) -> None:
    ordered_pool.run(disjoint_views_of_one_buffer, 1 << 16, 6)


def delegated_then_engine(numel: int, seed: int) -> None:
    """broadcast(t, src=last) then all_reduce(t), both in flight: world_size x the last rank's input."""
    world = dist.get_world_size()
    tensor = rank_tensor(dist.get_rank(), (numel,), torch.float32, seed)
    source = rank_tensor(world - 1, (numel,), torch.float32, seed)
    works = [dist.broadcast(tensor, src=world - 1, async_op=True), dist.all_reduce(tensor, async_op=True)]
    for work in reversed(works):
        work.wait()
    assert_matches(tensor, source * world)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("numel", NUMELS)
def test_broadcast_then_all_reduce(ordered_pool: RankPool, numel: int) -> None:
    ordered_pool.run(delegated_then_engine, numel, 7)


def engine_then_delegated(numel: int, seed: int) -> None:
    """all_reduce(t) then all_gather_into_tensor(out, t), both in flight: every rank's part is the sum."""
    world = dist.get_world_size()
    tensor = rank_tensor(dist.get_rank(), (numel,), torch.float32, seed)
    gathered = torch.empty(world * numel)
    works = [dist.all_reduce(tensor, async_op=True), dist.all_gather_into_tensor(gathered, tensor, async_op=True)]
    for work in reversed(works):
        work.wait()
    assert_matches(gathered, all_ranks_reduced((numel,), torch.float32, seed=seed).repeat(world))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("numel", NUMELS)
def test_all_reduce_then_all_gather(ordered_pool: RankPool, numel: int) -> None:
    ordered_pool.run(engine_then_delegated, numel, 8)


def gather_into_what_a_scatter_reads(numel: int, seed: int) -> None:
    """reduce_scatter_tensor(out, buf), then all_gather_into_tensor(buf, shard), both in flight on the engine:
    the reduce-scatter reduces what buf held before the all-gather overwrote it."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunk = numel // world
    inputs = [rank_tensor(r, (world * chunk,), torch.float32, seed) for r in range(world)]
    shards = [rank_tensor(r, (chunk,), torch.float32, seed + 1) for r in range(world)]
    buffer, out = inputs[rank].clone(), torch.empty(chunk)
    works = [
        dist.reduce_scatter_tensor(out, buffer, async_op=True),
        dist.all_gather_into_tensor(buffer, shards[rank].clone(), async_op=True),
    ]
    for work in reversed(works):
        work.wait()
    expected = torch.stack(inputs).double().sum(0).view(world, chunk)[rank].float()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(buffer, torch.cat(shards))


def scatter_what_a_gather_writes(numel: int, seed: int) -> bool:
    """all_gather_into_tensor(buf, shard), then reduce_scatter_tensor(out, buf), both in flight on the engine:
    the reduce-scatter reduces the gathered buf (its step 1 reads what the all-gather's last step writes).
    Whether it matched."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunk = numel // world
    shards = [rank_tensor(r, (chunk,), torch.float32, seed) for r in range(world)]
    buffer, out = torch.zeros(world * chunk), torch.empty(chunk)
    works = [
        dist.all_gather_into_tensor(buffer, shards[rank].clone(), async_op=True),
        dist.reduce_scatter_tensor(out, buffer, async_op=True),
    ]
    for work in reversed(works):
        work.wait()
    return torch.equal(buffer, torch.cat(shards)) and torch.allclose(out, shards[rank] * world, rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("numel", NUMELS)
def test_reduce_scatter_and_all_gather_on_one_buffer(ordered_pool: RankPool, numel: int) -> None:
    ordered_pool.run(gather_into_what_a_scatter_reads, numel, 9)
    assert all(ordered_pool.run(scatter_what_a_gather_writes, numel, 10)), f"{numel} floats"


def delegated_twice(numel: int, seed: int) -> None:
    """Two Gloo collectives on one tensor in flight: broadcast from rank 0, then from the last rank."""
    world = dist.get_world_size()
    tensor = rank_tensor(dist.get_rank(), (numel,), torch.float32, seed)
    works = [dist.broadcast(tensor, src=0, async_op=True), dist.broadcast(tensor, src=world - 1, async_op=True)]
    for work in works:
        work.wait()
    # The last rank's second broadcast sends what the first one wrote: rank 0's input.
    assert_matches(tensor, rank_tensor(0, (numel,), torch.float32, seed))


@pytest.mark.timeout(300)
def test_two_delegated_collectives(ordered_pool: RankPool) -> None:
    ordered_pool.run(delegated_twice, 1 << 20, 9)


def unordered(check, numel: int, seed: int) -> bool:  # type: ignore[no-untyped-def]
    from fairring import _C

    _C._testing.set_memory_order_enabled(False)
    try:
        return check(numel, seed)
    finally:
        _C._testing.set_memory_order_enabled(True)


@pytest.mark.timeout(300)
def test_negative_control_without_ordering_results_are_wrong(ordered_pool: RankPool) -> None:
    """The checks above can fail: with the ordering off, the second op reads its input too early."""
    matched = ordered_pool.run(unordered, twice_in_flight, 1 << 16, 11)
    assert not all(matched), "two unordered all-reduces of one tensor gave the ordered result on every rank"
    matched = ordered_pool.run(unordered, scatter_what_a_gather_writes, 1 << 16, 12)
    assert not all(matched), "a reduce-scatter of what an all-gather writes gave the ordered result unordered"


@pytest.fixture(scope="module")
def delegated_pool() -> Iterator[RankPool]:
    """Every collective on Gloo, whose reduce_scatter_tensor the next tests are about."""
    with RankPool(Layout(2, 2), InitSpec(extra_env={"FAIRRING_FLAT_THRESHOLD": "1TiB"})) as ranks:
        yield ranks


def rewritten_after_reduce_scatter(numel: int, seed: int) -> list[bool]:
    """reduce_scatter_tensor(out, t) waited, out rewritten, then all_reduce(out): it reduces what was written.

    Gloo's reduce_scatter_tensor copies the result into `out` inside wait(), on every call,
    and its Work never says it is complete: a second wait (the memory order's, before the
    all-reduce) would copy the stale result over what the caller wrote. Whether the
    reduce-scatter and then the all-reduce matched.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    tensor = rank_tensor(rank, (world * numel,), torch.float32, seed)
    out = torch.empty(numel)
    dist.reduce_scatter_tensor(out, tensor)
    expected = all_ranks_reduced((world * numel,), torch.float32, seed=seed).chunk(world)[rank]
    scattered = torch.allclose(out, expected.float(), rtol=1e-4, atol=1e-4)
    out.fill_(rank + 1)
    dist.all_reduce(out)
    return [scattered, torch.equal(out, torch.full((numel,), float(world * (world + 1) // 2)))]


@pytest.mark.timeout(300)
def test_reduce_scatter_output_rewritten_then_reduced(delegated_pool: RankPool) -> None:
    results = delegated_pool.run(rewritten_after_reduce_scatter, 1 << 12, 12)
    assert all(scattered for scattered, _ in results), "the reduce-scatter itself was wrong"
    assert all(reduced for _, reduced in results), "the all-reduce saw the reduce-scatter's stale result"


def reduce_scatter_output_released(numel: int) -> bool:
    """Once waited and dropped, a reduce-scatter's output is freed: fairring holds its Work no longer."""
    world = dist.get_world_size()
    out = torch.empty(numel)
    released = weakref.ref(out)
    dist.reduce_scatter_tensor(out, torch.ones(world * numel), async_op=True).wait()
    del out
    # As many collectives on every rank: the memory order lets go of completed Works as the
    # next one is issued, the hooks' poller within its interval.
    for _ in range(5):
        dist.all_reduce(torch.ones(numel))
        time.sleep(0.05)
    gc.collect()
    return released() is None


@pytest.mark.timeout(300)
def test_waited_reduce_scatter_is_released(delegated_pool: RankPool) -> None:
    assert all(delegated_pool.run(reduce_scatter_output_released, 1 << 12))


def without_completed_by_wait(numel: int, seed: int) -> list[bool]:
    from fairring import _C

    _C._testing.set_completed_by_wait_enabled(False)
    try:
        return [*rewritten_after_reduce_scatter(numel, seed), reduce_scatter_output_released(numel)]
    finally:
        _C._testing.set_completed_by_wait_enabled(True)


@pytest.mark.timeout(300)
def test_negative_control_gloo_work_as_gloo_made_it(delegated_pool: RankPool) -> None:
    """The checks of Gloo's reduce-scatter Work can fail: as Gloo made it, it is waited again
    (copying the stale result again) and held for ever."""
    results = delegated_pool.run(without_completed_by_wait, 1 << 12, 13)
    assert all(scattered for scattered, _, _ in results)
    assert not any(reduced for _, reduced, _ in results), "the stale copy did not happen: the control shows nothing"
    assert not any(released for _, _, released in results), "the Work was let go: the control shows nothing"
