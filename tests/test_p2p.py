"""Point-to-point operations through fairring: each rank sends to the next in a ring."""

from __future__ import annotations

import torch
import torch.distributed as dist

from benchmarks.harness import RankPool
from benchmarks.reference import assert_matches, rank_tensor

SHAPE = (17,)


def ring_neighbours() -> tuple[int, int, int]:
    rank, size = dist.get_rank(), dist.get_world_size()
    return rank, (rank + 1) % size, (rank - 1) % size


def send_recv() -> None:
    rank, successor, predecessor = ring_neighbours()
    received = torch.empty(SHAPE)
    # Even ranks send first, odd ranks receive first, so blocking calls pair up.
    if rank % 2 == 0:
        dist.send(rank_tensor(rank, SHAPE, torch.float32), dst=successor)
        dist.recv(received, src=predecessor)
    else:
        dist.recv(received, src=predecessor)
        dist.send(rank_tensor(rank, SHAPE, torch.float32), dst=successor)
    assert_matches(received, rank_tensor(predecessor, SHAPE, torch.float32))


def isend_irecv() -> None:
    rank, successor, predecessor = ring_neighbours()
    received = torch.empty(SHAPE)
    works = [
        dist.irecv(received, src=predecessor, tag=7),
        dist.isend(rank_tensor(rank, SHAPE, torch.float32), dst=successor, tag=7),
    ]
    for work in works:
        work.wait()
    assert_matches(received, rank_tensor(predecessor, SHAPE, torch.float32))


def batch_isend_irecv() -> None:
    rank, successor, predecessor = ring_neighbours()
    received = [torch.empty(SHAPE), torch.empty((3,))]
    operations = [
        dist.P2POp(dist.isend, rank_tensor(rank, SHAPE, torch.float32), successor),
        dist.P2POp(dist.irecv, received[0], predecessor),
        dist.P2POp(dist.isend, rank_tensor(100 + rank, (3,), torch.float32), predecessor),
        dist.P2POp(dist.irecv, received[1], successor),
    ]
    for work in dist.batch_isend_irecv(operations):
        work.wait()
    assert_matches(received[0], rank_tensor(predecessor, SHAPE, torch.float32))
    assert_matches(received[1], rank_tensor(100 + successor, (3,), torch.float32))


def test_send_recv(pool: RankPool) -> None:
    pool.run(send_recv)


def test_isend_irecv(pool: RankPool) -> None:
    pool.run(isend_irecv)


def test_batch_isend_irecv(pool: RankPool) -> None:
    pool.run(batch_isend_irecv)
