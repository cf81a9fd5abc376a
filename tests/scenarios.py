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


def resources_after_a_cycle(after: list[tuple[int, int, int]], patience_s: float = 10.0) -> tuple[int, int, int]:
    """process_resources() once the threads a destroyed group told to leave have left.

    A leaving thread may take a while on a loaded machine, so this waits (up to patience_s) for the
    thread count to come back to the warm cycle's (the third, as assert_resources_settled compares);
    a thread that really stays still fails that comparison."""
    deadline = time.monotonic() + patience_s
    while True:
        now = process_resources()
        if len(after) < 3 or now[0] <= after[2][0] or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


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


def every_collective_kind(device: str, numel: int, async_op: bool) -> list[str]:
    """Each kind of collective once on `device`, synchronous or not as `async_op` says, each result
    checked against torch's from every rank's input; the kinds run, in order. `numel` must divide by
    the world size: the reduce-scatters and all-gathers move `numel` elements in all."""
    rank, world = dist.get_rank(), dist.get_world_size()
    assert numel % world == 0, (numel, world)
    shard, last = numel // world, world - 1
    on = torch.device(device)

    def mine(seed: int, length: int = numel) -> torch.Tensor:
        return rank_tensor(rank, (length,), torch.float32, seed).to(on)

    def everyone(seed: int, length: int = numel) -> list[torch.Tensor]:
        return [rank_tensor(r, (length,), torch.float32, seed) for r in range(world)]

    def summed(seed: int) -> torch.Tensor:
        return all_ranks_reduced((numel,), torch.float32, seed=seed)

    def ended(work: dist.Work | None) -> None:
        # torch's Python waits for a synchronous op's Work itself and returns None.
        if async_op:
            assert work is not None
            work.wait()
        else:
            assert work is None, work

    kinds: list[str] = []

    def check(kind: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
        try:
            assert_matches(actual.cpu(), expected)
        except AssertionError as error:
            raise AssertionError(f"{kind} (numel {numel}, async_op={async_op}): {error}") from None

    tensor = mine(1)
    ended(dist.all_reduce(tensor, async_op=async_op))
    check("all_reduce", tensor, summed(1))
    kinds.append("all_reduce")

    output = torch.empty(shard, device=on)
    ended(dist.reduce_scatter_tensor(output, mine(2), async_op=async_op))
    check("reduce_scatter_tensor", output, summed(2).chunk(world)[rank])
    output = torch.empty(shard, device=on)
    ended(dist.reduce_scatter(output, list(mine(3).chunk(world)), async_op=async_op))
    check("reduce_scatter", output, summed(3).chunk(world)[rank])
    kinds += ["reduce_scatter_tensor", "reduce_scatter"]

    gathered = torch.empty(numel, device=on)
    ended(dist.all_gather_into_tensor(gathered, mine(4, shard), async_op=async_op))
    check("all_gather_into_tensor", gathered, torch.cat(everyone(4, shard)))
    outputs = [torch.empty(shard, device=on) for _ in range(world)]
    ended(dist.all_gather(outputs, mine(5, shard), async_op=async_op))
    check("all_gather", torch.cat(outputs), torch.cat(everyone(5, shard)))
    kinds += ["all_gather_into_tensor", "all_gather"]

    first, second = mine(6), mine(7, shard)
    with dist._coalescing_manager(device=on, async_ops=async_op) as block:
        dist.all_reduce(first)
        dist.all_reduce(second)
    if async_op:
        block.wait()
    check("coalesced all_reduce", first, summed(6))
    check("coalesced all_reduce", second, all_ranks_reduced((shard,), torch.float32, seed=7))
    kinds.append("coalesced all_reduce")

    tensor = mine(8)
    ended(dist.broadcast(tensor, src=last, async_op=async_op))
    check("broadcast", tensor, everyone(8)[last])
    tensor = mine(9)
    ended(dist.reduce(tensor, dst=last, async_op=async_op))
    if rank == last:
        check("reduce", tensor, summed(9))
    kinds += ["broadcast", "reduce"]

    gather_list = [torch.empty(shard, device=on) for _ in range(world)] if rank == last else None
    ended(dist.gather(mine(10, shard), gather_list, dst=last, async_op=async_op))
    if gather_list is not None:
        check("gather", torch.cat(gather_list), torch.cat(everyone(10, shard)))
    output = torch.empty(shard, device=on)
    scatter_list = list(mine(11).chunk(world)) if rank == last else None
    ended(dist.scatter(output, scatter_list, src=last, async_op=async_op))
    check("scatter", output, everyone(11)[last].chunk(world)[rank])
    kinds += ["gather", "scatter"]

    # Rank r receives chunk r of every rank's input.
    expected = torch.cat([theirs.chunk(world)[rank] for theirs in everyone(12)])
    output = torch.empty(numel, device=on)
    ended(dist.all_to_all_single(output, mine(12), async_op=async_op))
    check("all_to_all_single", output, expected)
    outputs = [torch.empty(shard, device=on) for _ in range(world)]
    ended(dist.all_to_all(outputs, list(mine(12).chunk(world)), async_op=async_op))
    check("all_to_all", torch.cat(outputs), expected)
    kinds += ["all_to_all_single", "all_to_all"]

    if world % 2 == 0:  # pairs: even ranks send first, odd ones receive first
        partner, sent, received = rank ^ 1, mine(13), torch.empty(numel, device=on)
        steps = [(dist.isend if async_op else dist.send, sent), (dist.irecv if async_op else dist.recv, received)]
        # Synchronous: send returns None and recv the sender's rank.
        returned = [step(tensor, partner) for step, tensor in (steps if rank % 2 == 0 else reversed(steps))]
        for work in returned if async_op else []:
            work.wait()
        check("send and recv", received, everyone(13)[partner])
        kinds.append("send and recv")

    ended(dist.barrier(async_op=async_op))
    kinds.append("barrier")
    return kinds


# Above and below a flat threshold of 64 KiB, in float32 elements (128 KiB and 4 KB).
ABOVE_64KIB, BELOW_64KIB = 32_768, 1_000


def every_kind_both_ways(device: str) -> dict[str, object]:
    """every_collective_kind above and below a 64 KiB threshold, synchronous then asynchronous; the
    paths they took (fairring.summary()'s ops by collective and path)."""
    import fairring

    kinds = {}
    for numel in (ABOVE_64KIB, BELOW_64KIB):
        for async_op in (False, True):
            kinds[f"{numel} async_op={async_op}"] = every_collective_kind(device, numel, async_op)
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))
    return {"kinds": kinds, "paths": {(row.collective, row.path): row.ops for row in fairring.summary().rows}}


def assert_every_kind_on_both_paths(outcomes: list[dict[str, object]], delegate: str) -> None:
    """Each rank's every_kind_both_ways: all 14 kinds ran each way, and each of the engine's three kinds
    took both the engine and `delegate` ("gloo", "nccl"), synchronously and not."""
    for outcome in outcomes:
        assert all(len(kinds) == 14 for kinds in outcome["kinds"].values()), outcome["kinds"]
        paths = outcome["paths"]
        for collective in ("all_reduce", "reduce_scatter", "all_gather"):
            assert paths.get((collective, "engine"), 0) >= 2, paths
            assert paths.get((collective, delegate), 0) >= 2, paths
