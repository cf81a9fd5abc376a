"""Rank functions that CPU and CUDA tests share: the same scenario on either device."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from benchmarks.reference import all_ranks_reduced, assert_matches, rank_tensor


def process_resources() -> tuple[int, int, int]:
    """Threads, open file descriptors and resident bytes of this process."""
    threads = len(os.listdir("/proc/self/task"))
    descriptors = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return threads, descriptors, resident_pages * os.sysconf("SC_PAGE_SIZE")


def assert_resources_settled(by_rank: list[list[tuple[int, int, int]]]) -> None:
    """Each rank's process_resources() after every cycle of a churn: from the third cycle on (the
    allocator and torch's pools have settled), no thread, descriptor or 16 MiB of memory more."""
    for rank, after in enumerate(by_rank):
        warm, last = after[2], after[-1]
        print(
            f"rank {rank}: threads {warm[0]} -> {last[0]}, fds {warm[1]} -> {last[1]}, "
            f"RSS {warm[2] / 2**20:.1f} -> {last[2] / 2**20:.1f} MiB"
        )
        assert last[0] <= warm[0], (rank, after)
        assert last[1] <= warm[1], (rank, after)
        assert last[2] - warm[2] < 16 * 2**20, (rank, after)


def make_engine(device: str) -> None:
    """An all-reduce on every rank: the group's first one on `device` makes its engine."""
    dist.all_reduce(torch.ones(8, device=device))


def shutdown_with_an_op_in_flight(device: str) -> tuple[float, str]:
    """Rank 0 issues an all-reduce that rank 1 never joins, then destroys the group.

    Returns, on rank 0, how long destroy_process_group took and the error the
    op's wait() raised.
    """
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    make_engine(device)
    if dist.get_rank() == 1:
        time.sleep(3)  # rank 0's op is stuck waiting for this rank's shards
        dist.destroy_process_group()
        return 0.0, ""
    work = dist.all_reduce(torch.ones(100_000, device=device), async_op=True)
    time.sleep(1)
    return timed_stop(work, dist.destroy_process_group)


def timed_stop(work: dist.Work, stop: Callable[[], object]) -> tuple[float, str]:
    """Runs `stop` while `work` is pending: how long it took, and the error `work` then raised."""
    start = time.monotonic()
    stop()
    elapsed = time.monotonic() - start
    try:
        work.wait()
    except RuntimeError as error:
        return elapsed, str(error)
    return elapsed, "no error"


def broadcast_then_two_all_reduces(device: str, numel: int, broadcast: bool = True) -> None:
    """NCCL's order: a broadcast and two all-reduces of one tensor in flight run in issue order.

    Without `broadcast` (ranks sharing one GPU, where NCCL refuses a delegated collective), the
    two all-reduces alone, which still read what the one before wrote.
    """
    world = dist.get_world_size()
    tensor = rank_tensor(dist.get_rank(), (numel,), torch.float32, seed=4).to(device)
    works = [dist.broadcast(tensor, src=world - 1, async_op=True)] if broadcast else []
    works += [dist.all_reduce(tensor, async_op=True), dist.all_reduce(tensor, async_op=True)]
    for work in reversed(works):
        work.wait()
    if broadcast:
        expected = rank_tensor(world - 1, (numel,), torch.float32, seed=4) * world * world
    else:
        inputs = [rank_tensor(r, (numel,), torch.float32, seed=4).double() for r in range(world)]
        expected = (torch.stack(inputs).sum(0) * world).float()
    assert_matches(tensor.cpu(), expected)


def checked_all_reduces(seed: int) -> None:
    """All-reduces of a few dtypes, ops and sizes (one of several slices), each checked against the reference."""
    for dtype, op, numel in [(torch.float32, "sum", 4096), (torch.int64, "max", 1000), (torch.float64, "sum", 1 << 19)]:
        tensor = rank_tensor(dist.get_rank(), (numel,), dtype, seed, op)
        dist.all_reduce(tensor, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
        assert_matches(tensor, all_ranks_reduced((numel,), dtype, op, seed))
