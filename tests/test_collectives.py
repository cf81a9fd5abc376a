"""The delegated collectives, against references from the known per-rank inputs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import RankPool
from benchmarks.reference import all_ranks_reduced, assert_matches, rank_tensor, reduce_reference

SHAPE = (5, 3)


def inputs_of_all_ranks(shape: tuple[int, ...] = SHAPE, seed: int = 0) -> list[torch.Tensor]:
    return [rank_tensor(r, shape, torch.float32, seed) for r in range(dist.get_world_size())]


def broadcast_from_last() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    tensor = rank_tensor(rank, SHAPE, torch.float32)
    dist.broadcast(tensor, src=size - 1)
    assert_matches(tensor, rank_tensor(size - 1, SHAPE, torch.float32))


def reduce_to_last() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    tensor = rank_tensor(rank, SHAPE, torch.float32)
    dist.reduce(tensor, dst=size - 1, op=dist.ReduceOp.MAX)
    if rank == size - 1:
        assert_matches(tensor, reduce_reference(inputs_of_all_ranks(), "max"))


def all_gather_list() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    outputs = [torch.empty(SHAPE) for _ in range(size)]
    dist.all_gather(outputs, rank_tensor(rank, SHAPE, torch.float32))
    for output, expected in zip(outputs, inputs_of_all_ranks(), strict=True):
        assert_matches(output, expected)


def all_gather_into_tensor() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    output = torch.empty((size * SHAPE[0], SHAPE[1]))
    dist.all_gather_into_tensor(output, rank_tensor(rank, SHAPE, torch.float32))
    assert_matches(output, torch.cat(inputs_of_all_ranks()))


def gather_to_first() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    outputs = [torch.empty(SHAPE) for _ in range(size)] if rank == 0 else None
    dist.gather(rank_tensor(rank, SHAPE, torch.float32), gather_list=outputs, dst=0)
    if rank == 0:
        for output, expected in zip(outputs, inputs_of_all_ranks(), strict=True):
            assert_matches(output, expected)


def scatter_from_last() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    pieces = inputs_of_all_ranks(seed=5) if rank == size - 1 else None
    output = torch.empty(SHAPE)
    dist.scatter(output, scatter_list=pieces, src=size - 1)
    assert_matches(output, inputs_of_all_ranks(seed=5)[rank])


def reduce_scatter_list() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    # Rank r contributes inputs[r][k] to rank k's output.
    inputs = [[rank_tensor(r * size + k, SHAPE, torch.float32) for k in range(size)] for r in range(size)]
    output = torch.empty(SHAPE)
    dist.reduce_scatter(output, inputs[rank])
    assert_matches(output, reduce_reference([inputs[r][rank] for r in range(size)], "sum"))


def reduce_scatter_tensor() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    shape = (size * 4, 3)
    output = torch.empty((4, 3))
    dist.reduce_scatter_tensor(output, rank_tensor(rank, shape, torch.float32))
    total = all_ranks_reduced(shape, torch.float32)
    assert_matches(output, total[rank * 4 : (rank + 1) * 4])


def all_to_all_list() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()

    # Rank r sends piece(r, k), of k + 1 rows, to rank k.
    def piece(src: int, dst: int) -> torch.Tensor:
        return rank_tensor(src * size + dst, (dst + 1, 2), torch.float32)

    outputs = [torch.empty((rank + 1, 2)) for _ in range(size)]
    dist.all_to_all(outputs, [piece(rank, k) for k in range(size)])
    for src, output in enumerate(outputs):
        assert_matches(output, piece(src, rank))


def all_to_all_single_uneven() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()

    # Rank r sends (r + k) % 3 rows to rank k, some of them empty.
    def rows(src: int, dst: int) -> int:
        return (src + dst) % 3

    def block(src: int, dst: int) -> torch.Tensor:
        return rank_tensor(src * size + dst, (rows(src, dst), 4), torch.float32)

    input_splits = [rows(rank, k) for k in range(size)]
    output_splits = [rows(k, rank) for k in range(size)]
    source = torch.cat([block(rank, k) for k in range(size)])
    output = torch.empty((sum(output_splits), 4))
    dist.all_to_all_single(output, source, output_splits, input_splits)
    assert_matches(output, torch.cat([block(k, rank) for k in range(size)]))


def barrier_orders_store_writes() -> None:
    # Every rank writes a key, then passes the barrier; after it, all keys
    # must be visible: the barrier really waited for every rank. add() returns
    # once the store holds the key; TCPStore's set() does not wait for that,
    # so another rank's check could overtake a set still on its way.
    rank, size = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    store.add(f"barrier-test/{rank}", 1)
    dist.barrier()
    assert all(store.check([f"barrier-test/{r}"]) for r in range(size))


@pytest.mark.parametrize(
    "collective",
    [
        broadcast_from_last,
        reduce_to_last,
        all_gather_list,
        all_gather_into_tensor,
        gather_to_first,
        scatter_from_last,
        reduce_scatter_list,
        reduce_scatter_tensor,
        all_to_all_list,
        all_to_all_single_uneven,
        barrier_orders_store_writes,
    ],
    ids=lambda f: f.__name__,
)
def test_collective(pool: RankPool, collective) -> None:  # type: ignore[no-untyped-def]
    pool.run(collective)


def unsupported_device_errors() -> list[str]:
    # Collectives on meta tensors stop at the dispatcher's meta kernels, so call
    # the backend object itself, as the dispatcher would with a device tensor.
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    meta = torch.empty(4, device="meta")
    messages = []
    for call in (
        lambda: backend.allreduce([meta]),
        lambda: backend.allgather([[torch.empty(4) for _ in range(dist.get_world_size())]], [meta]),
    ):
        try:
            call()
        except RuntimeError as error:
            messages.append(str(error))
        else:
            raise AssertionError("a collective on a meta tensor did not raise")
    return messages


def test_unsupported_and_mixed_devices_fail_clearly(pool: RankPool) -> None:
    for single_device, mixed in pool.run(unsupported_device_errors):
        assert "fairring: allreduce got a tensor on meta; fairring supports CPU and CUDA tensors" in single_device
        assert "fairring: allgather got tensors on both cpu and meta" in mixed, mixed
