"""The CUDA engine's ordering on the emulated device, with several ranks per machine.

No GPU this project sees can run 2+ ranks per machine, where the local steps
block their streams and an order that differs across ranks hangs the GPU. The
emulated device (csrc/device/emulated.h) runs StreamedContext, the ordering
code CUDA runs, over worker-thread streams with seeded jitter, real blocking
Gloo local steps on the stage streams, and the rails' receive copies on their
own stream. Every result is checked against a torch reference; every wait is
bounded by the group's timeout, whose error names the stage and slice each
rank waits in.

Negative controls: a device that runs all work in launch order, with the
engine's launch order off and the interleaving that deadlocks it forced, must
be reported as stuck in a local step; and a reduce that ignores the shards' arrival fences must give wrong
data that the check catches.
"""

from __future__ import annotations

import os
import random
import re
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import InitSpec, Layout, RankFailure, RankPool
from benchmarks.reference import REDUCE_OPS, all_ranks_reduced, assert_all_ranks_reduced, assert_matches, rank_tensor
from nixl_support import rails_env
from scenarios import broadcast_then_two_all_reduces

# Gloo local steps (the emulated NCCL), slices of 16 KiB so that most ops are
# several slices, staging for 4 of them.
EMULATED_ENV = {
    "FAIRRING_SHM_DISABLE": "1",
    "FAIRRING_SLICE_SIZE": "16KiB",
    "FAIRRING_MIN_SHARD_SIZE": "0",
    "FAIRRING_SLICES_IN_FLIGHT": "4",
}
KINDS = [("float32", "sum"), ("float64", "max"), ("int32", "min"), ("bfloat16", "sum"), ("int64", "product")]
SIZES = [(1, 64), (500, 5_000), (20_000, 120_000)]


def emulated(device: str, timeout: float = 60, **rank_env: str) -> InitSpec:
    return InitSpec(
        # TensorPipe's: the emulated device copies through bounce buffers, as its cuda_basic channel does.
        extra_env={**EMULATED_ENV, "FAIRRING_TEST_EMULATED_DEVICE": device, **rails_env("tensorpipe"), **rank_env},
        timeout=timedelta(seconds=timeout),
    )


def settle(work: dist.Work | None) -> None:
    """Waits for `work` as a caller would, then, where the engine launches ahead (`caller_stream`: the wait
    held only the caller's stream), for that stream too, so that the host may read the result."""
    if work is not None:
        work.wait()
    if "caller_stream" in os.environ.get("FAIRRING_TEST_EMULATED_DEVICE", ""):
        from fairring import _C

        assert _C._testing.caller_stream_synchronize(timeout=timedelta(seconds=60)), "the caller's stream stayed held"


def random_all_reduces(count: int, seed: int, in_flight: int, group: dist.ProcessGroup | None = None) -> int:
    """`count` all-reduces of random sizes, dtypes and ops, `in_flight` at a time, each checked.

    The sequence depends on `seed` only, so every rank issues the same one.
    """
    rank = dist.get_rank()
    chooser = random.Random(seed)
    pending: list[tuple[dist.Work, torch.Tensor, tuple[int, ...], str, str, int]] = []

    def check_oldest() -> None:
        work, tensor, shape, dtype, op, case = pending.pop(0)
        settle(work)
        assert_all_ranks_reduced(tensor, shape, getattr(torch, dtype), op, case)

    for index in range(count):
        low, high = chooser.choice(SIZES)
        shape = (chooser.randint(low, high),)
        dtype, op = chooser.choice(KINDS)
        case = seed * 100_000 + index
        tensor = rank_tensor(rank, shape, getattr(torch, dtype), case, op)
        work = dist.all_reduce(tensor, op=REDUCE_OPS[op], group=group, async_op=True)
        pending.append((work, tensor, shape, dtype, op, case))
        if len(pending) >= in_flight:
            check_oldest()
    while pending:
        check_oldest()
    return count


def two_groups_at_once(count: int, seed: int) -> int:
    """The world group from this thread and a second fairring group from another, both in flight."""
    second = dist.new_group(backend="fairring")
    # Each group's engine is made by its first all-reduce, a collective that
    # makes Gloo groups while holding the GIL: from one thread, in one order.
    for group in (None, second):
        dist.all_reduce(torch.ones(8), group=group)
    errors: list[BaseException] = []

    def on_second() -> None:
        try:
            random_all_reduces(count, seed + 1, in_flight=4, group=second)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    thread = threading.Thread(target=on_second, name="second-group")
    thread.start()
    try:
        done = random_all_reduces(count, seed, in_flight=6)
    finally:
        thread.join()
        dist.destroy_process_group(second)
    if errors:
        raise errors[0]
    return done


@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    ("layout", "failover", "per_group"),
    # 3x2 interleaved at a third of the ops (22 s on 2 cores at 150): the same mix, the layout's own
    # placement; the extended tier's stress runs thousands.
    [(Layout(2, 2), "0", 150), (Layout(3, 2, interleaved=True), "0", 50), (Layout(2, 2), "1", 150)],
    ids=["2x2", "3x2-interleaved", "2x2-kept-for-resends"],
)
def test_random_all_reduces_from_two_groups(layout: Layout, failover: str, per_group: int) -> None:
    """`per_group` all-reduces on each of two groups at once, jittered streams, every result checked.

    With rail failover on, each slice keeps its staging until its rail peers
    acknowledge its sends, past its all-gather: under the launch order, each
    op's first slice must then wait for an empty ring (Engine::start), or the
    launch order deadlocks (docs/design.md, "Launch order").
    """
    spec = emulated(f"seed={layout.machines}", FAIRRING_RAIL_FAILOVER=failover)
    with RankPool(layout, spec) as ranks:
        done = ranks.run(two_groups_at_once, per_group, 10 * layout.machines, timeout=360)
    assert done == [per_group] * layout.world_size


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("layout", "failover"),
    [(Layout(2, 2), "1"), (Layout(3, 2, interleaved=True), "0")],
    ids=["2x2-kept-for-resends", "3x2-interleaved"],
)
def test_random_all_reduces_launching_ahead(layout: Layout, failover: str) -> None:
    """The random mix on one group, the engine launching ahead (caller_stream), every result read after the
    caller's stream. One group: the emulated caller's stream is the process's, and two groups' waits from
    two threads on one stream can wait for each other across processes in different orders, as two NCCL
    groups' can; the two-group runs above keep the host's waits."""
    spec = emulated(f"seed={layout.machines},caller_stream", FAIRRING_RAIL_FAILOVER=failover)
    with RankPool(layout, spec) as ranks:
        assert ranks.run(random_all_reduces, 80, 10 * layout.machines, 6, timeout=240) == [80] * layout.world_size


# Thousands of ops per layout, on larger layouts: the extended tier (`make test-extended`; FAIRRING_STRESS_OPS
# sets how many). CI's random runs above are the same test, shorter.
STRESS_OPS = int(os.environ.get("FAIRRING_STRESS_OPS", "4000"))


@pytest.mark.extended
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("layout", [Layout(2, 3), Layout(4, 2)], ids=str)
def test_stress(layout: Layout) -> None:
    per_group = STRESS_OPS // 2
    with RankPool(layout, emulated(f"seed={STRESS_OPS}", timeout=120)) as ranks:
        done = ranks.run(two_groups_at_once, per_group, 7 * layout.machines, timeout=3300)
    assert done == [per_group] * layout.world_size


@pytest.mark.timeout(180)
def test_ops_on_the_same_tensor_run_in_issue_order() -> None:
    with RankPool(Layout(2, 2), emulated("seed=3")) as ranks:
        for numel in (1 << 12, 50_003):
            ranks.run(broadcast_then_two_all_reduces, "cpu", numel)


def few_multi_slice_ops() -> str:
    """Two ops of 8 slices each; the error, if one fails."""
    tensors = [rank_tensor(dist.get_rank(), (32_768,), torch.float32, seed) for seed in range(2)]
    works = [dist.all_reduce(tensor, async_op=True) for tensor in tensors]
    try:
        for work in works:
            settle(work)
    except RuntimeError as error:
        return str(error)
    for seed, tensor in enumerate(tensors):
        assert_matches(tensor, all_ranks_reduced((32_768,), torch.float32, seed=seed))
    return ""


def forced_env(layout: Layout, rank: int, base: str) -> dict[str, str]:
    first_of_machine = rank == layout.ranks_of(layout.machine_of(rank))[0]
    force = "force=rs_first" if first_of_machine else "force=ag_first"
    return {"FAIRRING_TEST_EMULATED_DEVICE": f"{base},{force}"}


# A device that runs all work in launch order (CUDA_DEVICE_MAX_CONNECTIONS=1,
# MPS), with the engine's launch order, and the negative control: that device
# with the local steps launched as the stage threads get to them. (Streams
# that progress on their own only make more progress; the random tests run
# them.)
DEVICE_DESIGNS = {
    "in_order": ",in_order",
    "in_order_unordered_launch": ",in_order,unordered_launch",
    "in_order_ahead": ",in_order,caller_stream",
    "in_order_ahead_unordered_launch": ",in_order,caller_stream,unordered_launch",
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("design", list(DEVICE_DESIGNS))
def test_forced_interleaving_deadlocks_only_without_the_launch_order(design: str) -> None:
    """On each machine, one rank would enqueue the next slice's reduce-scatter before an
    all-gather, the other the reverse (each holds its enqueue up to 500 ms for the other
    stage's). The launch order overrides both, so the ops complete on a device that runs
    everything in launch order; without it (the negative control) that device deadlocks,
    which must be reported within the group's timeout as a wait in a slice.
    """
    layout = Layout(2, 2)
    base = "seed=5" + DEVICE_DESIGNS[design]
    negative = design.endswith("unordered_launch")
    # Ordered, each forced hold lasts its full 500 ms: 16 of them per rank. Deadlocked, each rank waits
    # out the timeout: 8 s is past any op's time here, and ranks' errors must still all come.
    timeout = 8 if negative else 90
    rank_env = {rank: forced_env(layout, rank, base) for rank in range(layout.world_size)}
    with RankPool(layout, emulated(base, timeout=timeout), rank_env=rank_env) as ranks:
        errors = ranks.run(few_multi_slice_ops, timeout=150)
    if not negative:
        assert errors == [""] * layout.world_size, errors
        return
    assert all(errors), f"an in-order device completed under the deadlocking interleaving: {errors}"
    # Each rank names where it waits: a stage of a slice, stuck behind the cycle.
    for error in errors:
        assert re.search(rf"timed out after {timeout * 1000} ms, .*slice \d+ of 8", error), error


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ahead", ["", ",caller_stream"], ids=["host_launches", "launching_ahead"])
def test_random_all_reduces_on_a_device_that_runs_in_launch_order(ahead: str) -> None:
    """The random mix of ops on a device whose streams all feed one queue, every result checked. Launching
    ahead, every wait for the rails sits in that queue too, in the launch order (docs/design.md, "The host
    never waits")."""
    layout = Layout(2, 2)
    with RankPool(layout, emulated(f"seed=9,in_order{ahead}")) as ranks:
        assert ranks.run(random_all_reduces, 80, 17, 6, timeout=240) == [80] * layout.world_size


def reduce_without_arrival_fences() -> bool:
    """Whether a few multi-slice all-reduces all matched."""
    matched = True
    for seed in range(3):
        tensor = rank_tensor(dist.get_rank(), (40_000,), torch.float32, seed)
        dist.all_reduce(tensor)
        settle(None)
        expected = all_ranks_reduced((40_000,), torch.float32, seed=seed)
        matched = matched and torch.allclose(tensor, expected, rtol=1e-4, atol=1e-4)
    return matched


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "negative_control"])
@pytest.mark.parametrize("ahead", ["", ",caller_stream"], ids=["host_launches", "launching_ahead"])
def test_reduce_waits_for_the_shards_arrival(fenced: bool, ahead: str) -> None:
    """Receive copies that take 20 ms: with the arrival fences (launching ahead: the rails' signals) the
    result is right; without, the check fails."""
    device = "seed=7,receive_delay_ms=20" + ahead + ("" if fenced else ",ignore_arrivals")
    with RankPool(Layout(2, 2), emulated(device)) as ranks:
        matched = ranks.run(reduce_without_arrival_fences)
    if fenced:
        assert all(matched)
    else:
        assert not all(matched), "a reduce that ignored the arrival fences still matched the reference"


def test_emulated_device_settings_are_checked() -> None:
    """A setting the emulator does not know fails init, naming it."""
    with pytest.raises(RankFailure, match="unknown item 'bogus'"):
        with RankPool(Layout(2, 1), emulated("seed=1,bogus")) as ranks:
            ranks.run(few_multi_slice_ops)


def engine_made_before_the_first_all_reduce() -> dict[str, object]:
    """A broadcast first, then an all-reduce: when the engine is made, and what it says it holds."""
    import logging

    import fairring

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("fairring")
    logger.addHandler(Collect())
    logger.setLevel(logging.INFO)
    backend = fairring.backend_of()
    dist.broadcast(torch.ones(8), src=0)
    after_broadcast = backend.engine_footprint("cpu")
    ops_after_broadcast = (backend.engine_stats("cpu") or {"ops": 0})["ops"]
    tensor = rank_tensor(dist.get_rank(), (20_000,), torch.float32)
    dist.all_reduce(tensor)
    assert_matches(tensor, all_ranks_reduced((20_000,), torch.float32))
    footprint = backend.engine_footprint("cpu")
    return {
        "made_by_broadcast": after_broadcast is not None,
        "ops_after_broadcast": ops_after_broadcast,
        "footprint": footprint,
        "capacity": backend.staging_stats("cpu")["capacity_bytes"],
        "lines": [line for line in lines if "engine on cpu holds" in line],
    }


@pytest.mark.timeout(180)
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "lazy"])
def test_the_engine_is_made_and_warmed_up_at_the_first_collective(eager: bool) -> None:
    """As a CUDA engine is: made by the group's first collective of any kind (here a broadcast) and
    warmed up by one all-reduce of its own, so the first step allocates nothing new; its footprint is
    one call and one INFO line. Lazy (a CPU engine's way, the control): made by the first all-reduce."""
    device = "seed=13" + (",eager_engine" if eager else "")
    with RankPool(Layout(2, 2), emulated(device)) as ranks:
        outcomes = ranks.run(engine_made_before_the_first_all_reduce)
    for outcome in outcomes:
        assert outcome["made_by_broadcast"] is eager, outcome
        assert outcome["ops_after_broadcast"] == (1 if eager else 0), outcome  # the warm-up
        footprint = outcome["footprint"]
        # 2 x 2: a lane of each kind to the one rail peer, and control to it and the machine's other rank.
        assert footprint["connections"] == 4 and footprint["device"] == "cpu", footprint
        assert footprint["staging_bytes"] == outcome["capacity"] > 0, footprint
        assert footprint["added_threads"] > 0 and footprint["added_device_bytes"] == -1, footprint
        assert len(outcome["lines"]) == 1 and footprint["summary"] in outcome["lines"][0], outcome


def delegated_behind_engine_ops(in_turn: bool) -> dict[str, float]:
    """An engine all-reduce slowed by its receives, then a small one for the delegate, both async: how long
    issuing the small one took, and the whole; each result checked."""
    import time

    from fairring import _C

    _C._testing.set_launch_in_turn_enabled(in_turn)
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(32_768))  # the engine, made
    big = rank_tensor(rank, (32_768,), torch.float32, 1)
    small = rank_tensor(rank, (1000,), torch.float32, 2)
    start = time.monotonic()
    works = [dist.all_reduce(big, async_op=True)]
    before_small = time.monotonic()
    works.append(dist.all_reduce(small, async_op=True))
    issue_small_s = time.monotonic() - before_small
    for work in works:
        work.wait()
    total_s = time.monotonic() - start
    assert_matches(big, all_ranks_reduced((32_768,), torch.float32, seed=1))
    assert_matches(small, all_ranks_reduced((1000,), torch.float32, seed=2))
    return {"issue_small_s": issue_small_s, "total_s": total_s}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("in_turn", [True, False], ids=["in_turn", "negative_control"])
def test_a_delegated_all_reduce_does_not_wait_for_the_engine_on_its_callers_thread(in_turn: bool) -> None:
    """Behind an engine op of 8 slices whose receive copies take 100 ms each, a small all-reduce for the
    delegate (below the threshold) takes its place in the launch order and its issue returns at once; the
    negative control, which waits on the caller's thread for the engine's launches, takes most of the op."""
    device = "seed=17,receive_delay_ms=100,nccl_delegate"
    with RankPool(Layout(2, 2), emulated(device, FAIRRING_FLAT_THRESHOLD="64KiB")) as ranks:
        outcomes = ranks.run(delegated_behind_engine_ops, in_turn)
    for outcome in outcomes:
        assert outcome["total_s"] > 0.8, outcome  # 16 receive copies of 100 ms, one after another
        if in_turn:
            assert outcome["issue_small_s"] < 0.25 * outcome["total_s"], outcome
        else:
            assert outcome["issue_small_s"] > 0.5 * outcome["total_s"], outcome


def every_delegated_kind_behind_an_engine_op(in_turn: bool) -> dict[str, float]:
    """An engine all-reduce slowed by its receives, then a delegated broadcast, reduce-scatter, all-gather
    and all-to-all (below the threshold), all async: how long issuing each took, and the whole; every
    result checked against torch once all are waited for."""
    import time

    from fairring import _C

    _C._testing.set_launch_in_turn_enabled(in_turn)
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(torch.ones(32_768))  # the engine, made
    big = rank_tensor(rank, (32_768,), torch.float32, 1)
    mine = rank_tensor(rank, (world * 250,), torch.float32, 3)
    every = [rank_tensor(other, (world * 250,), torch.float32, 3) for other in range(world)]
    tensors = {
        "broadcast": mine.clone(),
        "reduce_scatter": torch.empty(250),
        "all_gather": torch.empty(world * world * 250),
        "all_to_all": torch.empty(world * 250),
    }
    issue = {
        "broadcast": lambda: dist.broadcast(tensors["broadcast"], src=0, async_op=True),
        # Each its own input: an op on memory an earlier one still uses waits for it (the memory order).
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(tensors["reduce_scatter"], mine.clone(), async_op=True),
        "all_gather": lambda: dist.all_gather_into_tensor(tensors["all_gather"], mine.clone(), async_op=True),
        "all_to_all": lambda: dist.all_to_all_single(tensors["all_to_all"], mine.clone(), async_op=True),
    }
    start = time.monotonic()
    works = [dist.all_reduce(big, async_op=True)]
    seconds: dict[str, float] = {}
    for kind, call in issue.items():
        before = time.monotonic()
        works.append(call())
        seconds[kind] = time.monotonic() - before
    for work in works:
        work.wait()
    seconds["total"] = time.monotonic() - start
    assert_matches(big, all_ranks_reduced((32_768,), torch.float32, seed=1))
    assert_matches(tensors["broadcast"], every[0])
    assert_matches(tensors["reduce_scatter"], sum(every).view(world, 250)[rank])
    assert_matches(tensors["all_gather"], torch.cat(every))
    assert_matches(tensors["all_to_all"], torch.cat([chunk.view(world, 250)[rank] for chunk in every]))
    return seconds


@pytest.mark.timeout(180)
@pytest.mark.parametrize("in_turn", [True, False], ids=["in_turn", "negative_control"])
def test_no_delegated_collective_waits_for_the_engine_on_its_callers_thread(in_turn: bool) -> None:
    """Issue 62, item 3: behind an engine op whose 16 receive copies take 100 ms each, a broadcast, a
    reduce-scatter, an all-gather and an all-to-all for the delegate each take their turn in the launch
    order, and each issue returns at once; the negative control, which waits on the caller's thread for
    the engine's launches, holds the first of them for most of the op. The delegate is the model of
    ProcessGroupNCCL (`nccl_delegate`), which refuses a second thread inside it at once."""
    device = "seed=29,receive_delay_ms=100,nccl_delegate"
    with RankPool(Layout(2, 2), emulated(device, FAIRRING_FLAT_THRESHOLD="64KiB")) as ranks:
        outcomes = ranks.run(every_delegated_kind_behind_an_engine_op, in_turn)
    for outcome in outcomes:
        total = outcome.pop("total")
        assert total > 0.8, outcome
        if in_turn:
            assert max(outcome.values()) < 0.25 * total, (outcome, total)
        else:
            assert max(outcome.values()) > 0.5 * total, (outcome, total)
