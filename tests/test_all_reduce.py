"""all_reduce through fairring, against references from the known per-rank inputs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import RankPool
from benchmarks.reference import (
    ARITHMETIC_OPS,
    BITWISE_OPS,
    FLOAT_DTYPES,
    INT_DTYPES,
    REDUCE_OPS,
    all_ranks_reduced,
    assert_matches,
    rank_tensor,
)


def all_reduce_matches(shape: tuple[int, ...], dtype_name: str, op: str, async_op: bool, seed: int) -> None:
    rank = dist.get_rank()
    dtype = getattr(torch, dtype_name)
    tensor = rank_tensor(rank, shape, dtype, seed, op)
    work = dist.all_reduce(tensor, op=REDUCE_OPS[op], async_op=async_op)
    if async_op:
        assert work.wait()
    assert_matches(tensor, all_ranks_reduced(shape, dtype, op, seed))


@pytest.mark.parametrize("op", ARITHMETIC_OPS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES)
def test_dtypes_and_ops(pool: RankPool, dtype: str, op: str) -> None:
    pool.run(all_reduce_matches, (37,), dtype, op, False, 1)


@pytest.mark.parametrize("op", BITWISE_OPS)
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_bitwise_ops(pool: RankPool, dtype: str, op: str) -> None:
    pool.run(all_reduce_matches, (37,), dtype, op, False, 2)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 5, 7), (1 << 16) + 3])
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_shapes(pool: RankPool, shape: tuple[int, ...] | int, async_op: bool) -> None:
    shape = shape if isinstance(shape, tuple) else (shape,)
    pool.run(all_reduce_matches, shape, "float32", "sum", async_op, 3)


def many_in_flight(count: int) -> None:
    rank = dist.get_rank()
    shapes = [(1 + 97 * i,) for i in range(count)]
    tensors = [rank_tensor(rank, shape, torch.float32, seed=i) for i, shape in enumerate(shapes)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for work in reversed(works):
        work.wait()
    for i, (shape, tensor) in enumerate(zip(shapes, tensors, strict=True)):
        assert_matches(tensor, all_ranks_reduced(shape, torch.float32, seed=i))


def test_many_concurrent_async_ops(pool: RankPool) -> None:
    pool.run(many_in_flight, 32)


def future_chaining() -> None:
    rank = dist.get_rank()
    tensor = rank_tensor(rank, (64,), torch.float32)
    future = dist.all_reduce(tensor, async_op=True).get_future()
    doubled = future.then(lambda done: done.value()[0] * 2).wait()
    expected = all_ranks_reduced((64,), torch.float32)
    assert_matches(doubled, expected * 2)
    assert_matches(tensor, expected)


def test_future_chaining(pool: RankPool) -> None:
    pool.run(future_chaining)


def coalesced(api: str) -> None:
    rank = dist.get_rank()
    shapes = [(5,), (0,), (3, 4), (1000,)]
    tensors = [rank_tensor(rank, shape, torch.float64, seed=i) for i, shape in enumerate(shapes)]
    if api == "all_reduce_coalesced":
        engine = dist.group.WORLD._get_backend(torch.device("cpu")).engine_stats
        ops_before = engine()["ops"] if engine() else None
        dist.all_reduce_coalesced(tensors)
        if ops_before is not None:  # the group spans machines: packed into one engine op
            assert engine()["ops"] == ops_before + 1
    else:
        with dist._coalescing_manager(async_ops=True) as manager:
            for tensor in tensors:
                dist.all_reduce(tensor)
        manager.wait()
    for i, (shape, tensor) in enumerate(zip(shapes, tensors, strict=True)):
        assert_matches(tensor, all_ranks_reduced(shape, torch.float64, seed=i))


@pytest.mark.parametrize("api", ["all_reduce_coalesced", "coalescing_manager"])
def test_coalesced(pool: RankPool, api: str) -> None:
    pool.run(coalesced, api)


def avg_matches(dtype_name: str) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, dtype_name)
    tensor = rank_tensor(rank, (37,), dtype, seed=4)
    dist.all_reduce(tensor, op=dist.ReduceOp.AVG)
    expected = (all_ranks_reduced((37,), dtype, seed=4).double() / size).to(dtype)
    assert_matches(tensor, expected)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_avg(pool: RankPool, dtype: str) -> None:
    pool.run(avg_matches, dtype)


def rejected_with(op: str, dtype_name: str) -> str:
    tensor = torch.arange(4).to(getattr(torch, dtype_name))
    reduce_op = dist._make_nccl_premul_sum(2.0) if op == "premul_sum" else REDUCE_OPS[op]
    try:
        dist.all_reduce(tensor, op=reduce_op)
    except (RuntimeError, ValueError) as error:
        return str(error)
    raise AssertionError(f"all_reduce with {op} on {dtype_name} returned {tensor} instead of raising")


@pytest.mark.parametrize(
    ("op", "dtype", "advice"),
    [("avg", "int32", "use ReduceOp.SUM and divide"), ("premul_sum", "int64", "needs a floating-point tensor")],
)
def test_unsupported_reductions_fail_clearly(pool: RankPool, op: str, dtype: str, advice: str) -> None:
    messages = pool.run(rejected_with, op, dtype)
    assert all("fairring" in message and advice in message for message in messages), messages


def premul_sum_matches(factor_kind: str, numel: int) -> None:
    """Each rank premultiplies by its own factor: the result is sum of factor_r x input_r."""
    rank, size = dist.get_rank(), dist.get_world_size()

    def factor(r: int) -> float:
        return 0.5 + r

    tensor = rank_tensor(rank, (numel,), torch.float64, seed=6)
    wrapped = torch.tensor([factor(rank)], dtype=torch.float64) if factor_kind == "tensor" else factor(rank)
    dist.all_reduce(tensor, op=dist._make_nccl_premul_sum(wrapped))
    expected = sum(factor(r) * rank_tensor(r, (numel,), torch.float64, seed=6) for r in range(size))
    assert_matches(tensor, expected)


@pytest.mark.parametrize("factor_kind", ["float", "tensor"])
@pytest.mark.parametrize("numel", [3, 10_001])
def test_premul_sum(pool: RankPool, factor_kind: str, numel: int) -> None:
    pool.run(premul_sum_matches, factor_kind, numel)
