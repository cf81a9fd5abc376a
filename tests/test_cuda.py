"""CUDA tensors through fairring: routed to NCCL, or on the engine. Needs a GPU.

NCCL refuses two ranks of one host on one GPU, and the machines lent to this
project have one GPU. So the engine tests either run one rank per machine (no
local NCCL group; a remainder rides padded in the last slice, so no NCCL
communicator spans the processes), or make each process an NCCL host of its own
(NCCL_HOSTID), which NCCL then connects through its socket transport: that is
how the 2x2 layout's local reduce-scatter and all-gather run on real NCCL on one
GPU (docs/design.md, "One GPU, several processes"). With a GPU per rank, the
2x2 layout runs as a cluster would.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import InitSpec, Layout, RankPool
from benchmarks.reference import (
    ARITHMETIC_OPS,
    FLOAT_DTYPES,
    INT_DTYPES,
    REDUCE_OPS,
    all_ranks_reduced,
    assert_matches,
    rank_tensor,
    reduce_reference,
)
from fairring.bench.shared_gpu import shared_gpu_env
from scenarios import (
    assert_every_kind_on_both_paths,
    broadcast_then_two_all_reduces,
    every_kind_both_ways,
    shutdown_with_an_op_in_flight,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch"),
]


def cuda_collectives() -> None:
    import fairring

    assert fairring.build_info()["cuda_path"], "this extension was built without its CUDA path"
    torch.cuda.set_device(0)
    tensor = rank_tensor(0, (1000,), torch.float32).cuda()
    dist.all_reduce(tensor)
    assert_matches(tensor.cpu(), rank_tensor(0, (1000,), torch.float32))
    gathered = torch.empty(1000, device="cuda")
    dist.all_gather_into_tensor(gathered, tensor)
    assert_matches(gathered.cpu(), tensor.cpu())
    future = dist.all_reduce(tensor, async_op=True).get_future()
    assert_matches(future.wait()[0].cpu(), rank_tensor(0, (1000,), torch.float32))
    dist.barrier()


def test_cuda_collectives_single_rank() -> None:
    with RankPool(Layout(1, 1)) as ranks:
        ranks.run(cuda_collectives)


# Small slices and staging: many slices per op, and the staging ring wraps.
CUDA_ENGINE_ENV = {
    "FAIRRING_CUDA_ENGINE": "1",
    "FAIRRING_SLICE_SIZE": "64KiB",
    "FAIRRING_TOTAL_MEMORY": "1MiB",
}


def cuda_backend() -> object:
    return dist.group.WORLD._get_backend(torch.device("cuda"))


def engine_matches_reference(device_of_rank: str, sizes: list[int]) -> dict[str, int]:
    """Every dtype and op at each size, several ops in flight, against torch on the CPU."""
    rank = dist.get_rank()
    device = torch.device(device_of_rank.format(rank=rank))
    torch.cuda.set_device(device)
    cases = [(d, op) for d in (*FLOAT_DTYPES, *INT_DTYPES) for op in ARITHMETIC_OPS]
    cases += [(d, "avg") for d in FLOAT_DTYPES]
    for numel in sizes:
        tensors, works = [], []
        for seed, (dtype_name, op) in enumerate(cases):
            dtype = getattr(torch, dtype_name)
            source_op = "sum" if op == "avg" else op
            tensor = rank_tensor(rank, (numel,), dtype, seed=seed, op=source_op).to(device)
            tensors.append(tensor)
            works.append(dist.all_reduce(tensor, op=REDUCE_OPS[op], async_op=True))
        for seed, ((dtype_name, op), tensor, work) in enumerate(zip(cases, tensors, works, strict=True)):
            work.wait()
            dtype = getattr(torch, dtype_name)
            if op == "avg":
                expected = (all_ranks_reduced((numel,), torch.float64, seed=seed) / dist.get_world_size()).to(dtype)
            else:
                expected = all_ranks_reduced((numel,), dtype, op, seed=seed)
            assert_matches(tensor.cpu(), expected)
    return cuda_backend().engine_stats("cuda")


def engine_orders_streams(device_of_rank: str) -> None:
    """Input written and result read on a side stream, with no host sync between."""
    rank = dist.get_rank()
    device = torch.device(device_of_rank.format(rank=rank))
    torch.cuda.set_device(device)
    numel = 1 << 20
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        tensor = torch.zeros(numel, device=device)
        torch.cuda._sleep(50_000_000)  # the input is late: the engine must wait for it
        tensor.add_(rank + 1)
        work = dist.all_reduce(tensor, async_op=True)
        work.wait()  # orders the side stream after the all-reduce, without blocking
        doubled = tensor * 2
        future = dist.all_reduce(doubled, async_op=True).get_future().then(lambda f: f.value()[0] + 1)
    side.synchronize()
    total = sum(r + 1 for r in range(dist.get_world_size()))
    assert_matches(tensor.cpu(), torch.full((numel,), float(total)))
    assert_matches(future.wait().cpu(), torch.full((numel,), float(2 * total * dist.get_world_size() + 1)))


def engine_premul_sum_and_non_contiguous(device_of_rank: str) -> None:
    rank = dist.get_rank()
    device = torch.device(device_of_rank.format(rank=rank))
    torch.cuda.set_device(device)
    world = dist.get_world_size()
    tensor = rank_tensor(rank, (64, 32), torch.float32).to(device).t()  # not contiguous
    dist.all_reduce(tensor, op=dist._make_nccl_premul_sum(float(rank + 1)))
    inputs = [rank_tensor(r, (64, 32), torch.float64) * (r + 1) for r in range(world)]
    assert_matches(tensor.cpu(), torch.stack(inputs).sum(0).to(torch.float32).t())


def engine_reduce_scatters_and_all_gathers(device_of_rank: str) -> None:
    """reduce_scatter_tensor and all_gather_into_tensor on the engine, against torch on the CPU:
    several in flight, in place, and an input the caller's side stream writes late."""
    world, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device(device_of_rank.format(rank=rank))
    torch.cuda.set_device(device)
    before = cuda_backend().engine_stats("cuda")["ops"]
    issued = 0
    for chunk in (1, 1001, 40_003):
        for seed, (dtype_name, op) in enumerate((("float32", "sum"), ("bfloat16", "max"), ("int32", "sum"))):
            dtype = getattr(torch, dtype_name)
            inputs = [rank_tensor(r, (world * chunk,), dtype, seed, op) for r in range(world)]
            shards = [rank_tensor(r, (chunk,), dtype, seed + 7) for r in range(world)]
            scattered = torch.empty(chunk, dtype=dtype, device=device)
            gathered = torch.empty(world * chunk, dtype=dtype, device=device)
            gathered.narrow(0, rank * chunk, chunk).copy_(shards[rank])
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                source = torch.zeros(world * chunk, dtype=dtype, device=device)
                torch.cuda._sleep(20_000_000)  # the input is late: the engine must wait for it
                source.copy_(inputs[rank])
                works = [
                    dist.reduce_scatter_tensor(scattered, source, op=REDUCE_OPS[op], async_op=True),
                    dist.all_gather_into_tensor(gathered, gathered.narrow(0, rank * chunk, chunk), async_op=True),
                ]
                for work in works:
                    work.wait()
            side.synchronize()
            issued += 2
            expected = reduce_reference(inputs, op).view(world, chunk)[rank]
            assert_matches(scattered.cpu(), expected)
            assert torch.equal(gathered.cpu(), torch.cat(shards))
    assert cuda_backend().engine_stats("cuda")["ops"] == before + issued, "not all ran on the engine"
    # The other forms, each one engine op: a coalesced block (ZeRO's), lists, and a PREMUL_SUM (NCCL's own
    # op, scaled into the packed input on the engine), against torch on the CPU.
    numels = [1, 40_003]
    inputs = [[rank_tensor(r, (world * n,), torch.float32, 5 + j) for j, n in enumerate(numels)] for r in range(world)]
    outputs = [torch.empty(n, device=device) for n in numels]
    with dist._coalescing_manager(async_ops=True) as coalesced:
        for output, tensor in zip(outputs, inputs[rank], strict=True):
            dist.reduce_scatter_tensor(output, tensor.to(device), op=dist._make_nccl_premul_sum(float(rank + 1)))
    coalesced.wait()
    gathered = [torch.empty(1001, device=device) for _ in range(world)]
    dist.all_gather(gathered, torch.full((1001,), float(rank), device=device))
    assert cuda_backend().engine_stats("cuda")["ops"] == before + issued + 2, "a form left the engine"
    for j, n in enumerate(numels):
        weighted = sum((r + 1) * inputs[r][j].double() for r in range(world)).view(world, n)[rank].float()
        torch.testing.assert_close(outputs[j].cpu(), weighted, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(tensor.cpu(), torch.full((1001,), float(r))) for r, tensor in enumerate(gathered))


def engine_orders_ops_on_one_tensor(device_of_rank: str, broadcast: bool) -> None:
    device = torch.device(device_of_rank.format(rank=dist.get_rank()))
    torch.cuda.set_device(device)
    broadcast_then_two_all_reduces(str(device), 300_001, broadcast=broadcast)


def captured_all_reduces_replay(device_of_rank: str) -> dict[str, int]:
    """DDP's way with CUDA graphs: bucket all-reduces captured on a side stream after a warm-up, the
    graph replayed on new inputs, each replay's result checked. NCCL captures them (the engine, which
    waits on the host, cannot be captured); the engine's counters must not move."""
    import fairring

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(device_of_rank.format(rank=rank))
    torch.cuda.set_device(device)
    buckets = [torch.ones(numel, device=device) for numel in (1000, 300_001)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up: eager, on the engine where it is on
        for bucket in buckets:
            dist.all_reduce(bucket)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize(device)
    before = fairring.backend_of(None, "cuda").engine_stats("cuda") or {"ops": 0}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        works = [dist.all_reduce(bucket, async_op=True) for bucket in buckets]
        for work in works:
            work.wait()
        for bucket in buckets:
            bucket.div_(world)
    for replay in range(3):
        for bucket in buckets:
            bucket.copy_(rank_tensor(rank, tuple(bucket.shape), torch.float32, seed=replay).to(device))
        graph.replay()
        torch.cuda.synchronize(device)
        for bucket in buckets:
            expected = all_ranks_reduced(tuple(bucket.shape), torch.float64, seed=replay) / world
            assert_matches(bucket.cpu(), expected.to(torch.float32))
    after = fairring.backend_of(None, "cuda").engine_stats("cuda") or {"ops": 0}
    return {"engine_ops_in_graph": after["ops"] - before["ops"], "engine_ops": after["ops"]}


ONE_GPU = "cuda:0"
GPU_PER_RANK = "cuda:{rank}"


def one_nccl_host_per_process(world: int) -> dict[int, dict[str, str]]:
    """Each rank's NCCL_HOSTID, so that NCCL takes several processes on one GPU (see the docstring), and
    NCCL's socket transport on loopback, as the GPU check runs them."""
    return {rank: shared_gpu_env(rank, "fairring-test-cuda", loopback=True) for rank in range(world)}


def devices_for(layout: Layout) -> tuple[str, dict[int, dict[str, str]] | None]:
    """A GPU per rank where there are enough; else one GPU, each process its own NCCL host."""
    if torch.cuda.device_count() >= layout.world_size:
        return GPU_PER_RANK, None
    return ONE_GPU, one_nccl_host_per_process(layout.world_size)


def run_engine_checks(
    layout: Layout, device_of_rank: str, sizes: list[int], nccl_hosts: dict[int, dict[str, str]] | None = None
) -> list[dict[str, int]]:
    """Every check above on `layout`; the engine counters of each rank. Ranks sharing one GPU as one
    NCCL host (no `nccl_hosts`) skip the delegated broadcast, which NCCL refuses ("Duplicate GPU")."""
    broadcast = "{rank}" in device_of_rank or nccl_hosts is not None
    with RankPool(layout, InitSpec(extra_env=CUDA_ENGINE_ENV), rank_env=nccl_hosts) as ranks:
        results = ranks.run(engine_matches_reference, device_of_rank, sizes, timeout=600)
        ranks.run(engine_orders_streams, device_of_rank)
        ranks.run(engine_premul_sum_and_non_contiguous, device_of_rank)
        ranks.run(engine_orders_ops_on_one_tensor, device_of_rank, broadcast)
        ranks.run(engine_reduce_scatters_and_all_gathers, device_of_rank)
    return results


def test_cuda_engine_two_machines_on_one_gpu() -> None:
    # Odd sizes too: their remainder is padded, never sent to a NCCL group.
    for stats in run_engine_checks(Layout(2, 1), ONE_GPU, [1, 2, 1001, 40_000, 300_001]):
        print(f"fairring: CUDA engine counters on one GPU: {stats}")
        assert stats is not None and stats["ops"] > 0 and stats["flat_ops"] == 0
        assert stats["rail_bytes_received"] == stats["rail_bytes_sent"] > 0


def test_cuda_engine_with_local_groups() -> None:
    """2x2: the engine's local reduce-scatter and all-gather on real NCCL groups."""
    layout = Layout(2, 2)
    device_of_rank, nccl_hosts = devices_for(layout)
    for stats in run_engine_checks(layout, device_of_rank, [1, 3, 1001, 300_001], nccl_hosts):
        assert stats is not None and stats["slices"] > 0 and stats["flat_ops"] == 0
        assert stats["local_steps"] == "nccl", stats


def every_kind_on_nccl(device_of_rank: str) -> dict[str, object]:
    """every_kind_both_ways on this rank's GPU, on real NCCL (which returns no Work for a synchronous op)."""
    device = torch.device(device_of_rank.format(rank=dist.get_rank()))
    torch.cuda.set_device(device)
    return every_kind_both_ways(str(device))


def native_block_behind_a_launch_in_turn(device_of_rank: str) -> None:
    """An engine all-reduce, a small one that takes its turn behind it (launched later, on a stage
    thread), then a native NCCL coalescing block: the block must not take that launch in (NCCL's
    coalescing state is its group's, not a thread's). Every result checked."""
    rank = dist.get_rank()
    device = torch.device(device_of_rank.format(rank=rank))
    torch.cuda.set_device(device)
    tensors = [rank_tensor(rank, (n,), torch.float32, seed=n).to(device) for n in (4_000_001, 1000, 5, 777)]
    works = [dist.all_reduce(tensor, async_op=True) for tensor in tensors[:2]]
    with dist._coalescing_manager(device=device, async_ops=True) as block:
        for tensor in tensors[2:]:
            dist.all_reduce(tensor)
    block.wait()
    for work in works:
        work.wait()
    for tensor in tensors:
        numel = tensor.numel()
        assert_matches(tensor.cpu(), all_ranks_reduced((numel,), torch.float32, seed=numel))


def test_every_kind_synchronous_or_not_on_nccl() -> None:
    """async_op=False and True for every collective kind, on the engine and on NCCL, 2 x 2 (issue 62:
    NCCL returns no Work for a synchronous op, which fairring must never dereference); and a native
    coalescing block behind a launch in turn."""
    layout = Layout(2, 2)
    device_of_rank, nccl_hosts = devices_for(layout)
    env = {**CUDA_ENGINE_ENV, "FAIRRING_SERIALIZED_LAUNCHES": "engine", "FAIRRING_CUDA_FLAT_THRESHOLD": "64KiB"}
    with RankPool(layout, InitSpec(extra_env=env), rank_env=nccl_hosts) as ranks:
        outcomes = ranks.run(every_kind_on_nccl, device_of_rank, timeout=300)
        ranks.run(native_block_behind_a_launch_in_turn, device_of_rank, timeout=120)
    assert_every_kind_on_both_paths(outcomes, "nccl")


def synchronous_engine_all_reduce_timed(device_of_rank: str) -> dict[str, float]:
    """How long a synchronous engine all-reduce of 16 MiB held the host, and how long until the GPU had
    its result (torch.cuda.synchronize); the result checked."""
    import time

    rank = dist.get_rank()
    device = torch.device(device_of_rank.format(rank=rank))
    torch.cuda.set_device(device)
    numel = 4 << 20
    dist.all_reduce(torch.ones(numel, device=device))  # the engine, made
    tensor = rank_tensor(rank, (numel,), torch.float32, seed=5).to(device)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    dist.all_reduce(tensor)
    held_s = time.perf_counter() - start
    torch.cuda.synchronize(device)
    op_s = time.perf_counter() - start
    assert_matches(tensor.cpu(), all_ranks_reduced((numel,), torch.float32, seed=5))
    from fairring._config import load_config

    return {"held_s": held_s, "op_s": op_s, "launched_ahead": load_config().cuda_wait == "stream"}


def test_a_synchronous_engine_all_reduce_holds_the_stream_not_the_host() -> None:
    """docs/design.md, "The host never waits": the engine launches the op's device work ahead of the
    network (its waits for the rails are signal wait kernels on its streams), and the call returns
    once the caller's stream waits for the op's last local step, long before the result has come back
    from the network; the result read after torch.cuda.synchronize() is exact. A signal that was never
    raised would hang here until the test's timeout; a wait that passed early would fail the check."""
    env = {**CUDA_ENGINE_ENV, "FAIRRING_SERIALIZED_LAUNCHES": "engine", "FAIRRING_TOTAL_MEMORY": "8MiB"}
    with RankPool(Layout(2, 1), InitSpec(extra_env=env)) as ranks:
        outcomes = ranks.run(synchronous_engine_all_reduce_timed, ONE_GPU, timeout=120)
    assert all(outcome["launched_ahead"] for outcome in outcomes), outcomes  # the default
    for outcome in outcomes:
        held_ms, op_ms = outcome["held_s"] * 1e3, outcome["op_s"] * 1e3
        print(f"fairring: a synchronous engine all-reduce of 16 MiB held the host {held_ms:.2f} ms of {op_ms:.1f} ms")
        assert outcome["held_s"] < 0.25 * outcome["op_s"], outcome


def engine_ops_in_a_coalescing_block(device_of_rank: str) -> None:
    """Engine all-reduces inside a raw coalescing block: the block's Work covers them."""
    rank = dist.get_rank()
    device = torch.device(device_of_rank.format(rank=rank))
    torch.cuda.set_device(device)
    tensors = [rank_tensor(rank, (n,), torch.float32, seed=n).to(device) for n in (3, 100_001)]
    group = dist.group.WORLD
    group._start_coalescing(device)
    for tensor in tensors:
        dist.all_reduce(tensor, async_op=True)
    group._end_coalescing(device).wait()
    for tensor in tensors:
        numel = tensor.numel()
        assert_matches(tensor.cpu(), all_ranks_reduced((numel,), torch.float32, seed=numel))


def test_cuda_engine_coalescing_and_shutdown_on_one_gpu() -> None:
    with RankPool(Layout(2, 1), InitSpec(extra_env=CUDA_ENGINE_ENV)) as ranks:
        ranks.run(engine_ops_in_a_coalescing_block, ONE_GPU)
        (elapsed, error), _ = ranks.run(shutdown_with_an_op_in_flight, ONE_GPU, timeout=60)
    assert elapsed < 5, elapsed
    assert "rank 0 (machine 0 of 2) shut down its process group" in error, error


def shrink_a_cuda_group(device_of_rank: str) -> dict[str, object]:
    """3 x 1, the engine and NCCL both used; rank 2 leaves and the others shrink: a group with an engine
    makes a new NCCL communicator (a failure may have aborted the old one), the engine is made anew for
    2 x 1, and CPU tensors still work."""
    import fairring

    rank = dist.get_rank()
    device = torch.device(device_of_rank.format(rank=rank))
    torch.cuda.set_device(device)
    shape = (40_000,)
    dist.all_reduce(rank_tensor(rank, shape, torch.float32).to(device))  # the engine
    dist.broadcast(torch.ones(4, device=device), src=0)  # the NCCL delegate
    torch.cuda.synchronize(device)
    if rank == 2:
        dist.destroy_process_group()
        return {}
    group = dist.shrink_group([2])
    tensor = rank_tensor(rank, shape, torch.float32, seed=1).to(device)
    dist.all_reduce(tensor)
    inputs = [rank_tensor(survivor, shape, torch.float32, seed=1) for survivor in (0, 1)]
    assert_matches(tensor.cpu(), reduce_reference(inputs, "sum"))
    sent = torch.full((4,), float(rank), device=device)
    dist.broadcast(sent, src=1)  # through the shrunk group's NCCL communicator
    assert torch.all(sent.cpu() == 1), sent
    on_cpu = torch.ones(4)
    dist.all_reduce(on_cpu)
    assert torch.all(on_cpu == 2), on_cpu
    stats = fairring.backend_of(group, "cuda").engine_stats("cuda")
    dist.destroy_process_group()
    return {"size": group.size(), "on_engine": stats is not None and stats["ops"] > 0}


def test_shrink_group_on_cuda() -> None:
    layout = Layout(3, 1)
    device_of_rank, nccl_hosts = devices_for(layout)
    with RankPool(layout, InitSpec(extra_env=CUDA_ENGINE_ENV), rank_env=nccl_hosts) as ranks:
        outcomes = ranks.run(shrink_a_cuda_group, device_of_rank, timeout=300)
    for rank in (0, 1):
        assert outcomes[rank] == {"size": 2, "on_engine": True}, outcomes


def test_cuda_engine_keeps_staging_until_acknowledged() -> None:
    """2x2 with rails failover on: each slice's staging is kept until its rail peers acknowledge its
    sends, past its all-gather, so each op's first slice waits for an empty ring (docs/design.md,
    "Rails that fail over"); on a GPU that runs in launch order, where a wrong wait deadlocks."""
    layout = Layout(2, 2)
    device_of_rank, nccl_hosts = devices_for(layout)
    env = {**CUDA_ENGINE_ENV, "FAIRRING_RAIL_FAILOVER": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    env["FAIRRING_SERIALIZED_LAUNCHES"] = "engine"  # one group at a time: the engine stays on
    with RankPool(layout, InitSpec(extra_env=env), rank_env=nccl_hosts) as ranks:
        for stats in ranks.run(engine_matches_reference, device_of_rank, [1001, 300_001], timeout=600):
            assert stats is not None and stats["slices"] > 0 and stats["local_steps"] == "nccl", stats


@pytest.mark.parametrize("engine", ["off", "on"])
def test_captured_all_reduces_replay(engine: str) -> None:
    """A fairring group's all-reduces captured into a CUDA graph and replayed, engine off and on: NCCL
    runs them in the graph (NCCL_RUNTIME_CONNECT=0: its connections made at init, not in the capture)."""
    layout = Layout(2, 1)
    device_of_rank, nccl_hosts = devices_for(layout)
    env = {**(CUDA_ENGINE_ENV if engine == "on" else {}), "NCCL_RUNTIME_CONNECT": "0"}
    with RankPool(layout, InitSpec(extra_env=env), rank_env=nccl_hosts) as ranks:
        outcomes = ranks.run(captured_all_reduces_replay, device_of_rank, timeout=300)
    for outcome in outcomes:
        assert outcome["engine_ops_in_graph"] == 0, outcome
        assert (outcome["engine_ops"] > 0) == (engine == "on"), outcome


def engine_made_at_init(device_of_rank: str) -> dict[str, object]:
    """A group made with device_id holds its engine, warmed up, before its first collective; its first
    all-reduce then allocates nothing on the GPU (the device's memory in use does not move)."""
    import fairring

    rank = dist.get_rank()
    device = torch.device(device_of_rank.format(rank=rank))
    torch.cuda.set_device(device)
    group = dist.new_group(backend="fairring", device_id=device)
    backend = fairring.backend_of(group, "cuda")
    footprint = backend.engine_footprint("cuda")
    tensor = rank_tensor(rank, (300_001,), torch.float32).to(device)
    torch.cuda.synchronize(device)
    free_before, _ = torch.cuda.mem_get_info(device)
    dist.all_reduce(tensor, group=group)
    torch.cuda.synchronize(device)
    free_after, _ = torch.cuda.mem_get_info(device)
    assert_matches(tensor.cpu(), all_ranks_reduced((300_001,), torch.float32))
    dist.destroy_process_group(group)
    return {"footprint": footprint, "allocated_by_first_all_reduce": free_before - free_after}


def test_the_cuda_engine_is_made_at_init_with_device_id() -> None:
    layout = Layout(2, 2)
    device_of_rank, nccl_hosts = devices_for(layout)
    with RankPool(layout, InitSpec(extra_env=CUDA_ENGINE_ENV), rank_env=nccl_hosts) as ranks:
        outcomes = ranks.run(engine_made_at_init, device_of_rank, timeout=300)
    for outcome in outcomes:
        print(f"fairring: the CUDA engine made at init: {outcome}")
        footprint = outcome["footprint"]
        assert footprint is not None and footprint["staging_bytes"] > 0, outcome
        assert footprint["added_device_bytes"] >= footprint["staging_bytes"], outcome
        assert outcome["allocated_by_first_all_reduce"] == 0, outcome


def auto_counts_free_gpu_memory() -> None:
    from fairring._dispatch import Sweep

    device = torch.device("cuda", 0)
    sweep = Sweep(lambda *_: None, lambda row: torch.tensor([row]), device, 0, 1, "nccl")
    held = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    before = sweep._free_bytes()
    del held  # back to torch's caching allocator, not to the driver: still this rank's to take
    after = sweep._free_bytes()
    free, total = torch.cuda.mem_get_info(device)
    assert abs(after - before - (256 << 20)) <= 16 << 20, (before, after)
    assert free <= after <= total, (free, after, total)


def auto_draws_inputs_on_the_gpu() -> None:
    from fairring._dispatch import rank_input

    device = torch.device("cuda", 0)
    first, again = (rank_input(0, 1 << 20, torch.float32, device) for _ in range(2))
    assert first.device == device and torch.equal(first, again), "not reproducible"
    assert -1 <= first.min().item() and first.max().item() < 1 and first.unique().numel() > 200_000
    assert not torch.equal(first, rank_input(1, 1 << 20, torch.float32, device)), "two ranks drew alike"
    integers = rank_input(0, 256 << 10, torch.int32, device)
    assert integers.device == device and integers.abs().max().item() <= 1 << 20


def test_autos_climb_counts_the_gpus_free_memory_and_torchs_cached_blocks() -> None:
    """What the climb of FAIRRING_CUDA_ENGINE=auto asks of each rank before a size (fairring/_dispatch.py):
    the driver's free memory plus the caching allocator's free blocks, where a tensor torch freed stays;
    and its inputs, drawn on the GPU."""
    with RankPool(Layout(1, 1)) as ranks:
        ranks.run(auto_counts_free_gpu_memory)
        ranks.run(auto_draws_inputs_on_the_gpu)
