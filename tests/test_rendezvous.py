"""The scalable rendezvous (fairring/_rendezvous.py) against a real TCPStore.

Small groups run as threads, each rank with its own client and the real
`rendezvous`; larger ones and many layouts run through `drive`, which steps
every rank's protocol on one thread and one client. Expected views come from
`group_into_machines`, the grouping the rendezvous must reproduce.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta

import pytest
import torch.distributed as dist

from benchmarks.counting_store import CountingStore
from fairring._config import FLAT_THRESHOLD, MACHINE_ID, SLICE_SIZE, ConfigError
from fairring._rendezvous import RankView, Steps, WaitTimedOut, rendezvous, rendezvous_steps
from fairring._topology import RankIdentity, TopologyError, group_into_machines

SETTINGS = {SLICE_SIZE: 4 << 20, FLAT_THRESHOLD: 0}
TIMEOUT = timedelta(seconds=20)
TORCHRUN = "torchrun's GROUP_RANK"
# Thread ranks (each with its own client) in the largest thread test.
THREADS = 32


@pytest.fixture(scope="module")
def clients() -> Iterator[list[dist.TCPStore]]:
    """One server and a client per thread rank, shared: connecting is the slow part of a test."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT, use_libuv=True)
    yield [
        dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=TIMEOUT, use_libuv=True)
        for _ in range(THREADS)
    ]
    del server


@pytest.fixture
def stores(request: pytest.FixtureRequest, clients: list[dist.TCPStore]) -> list[dist.Store]:
    """The clients, in a key space of this test's own (as a group's PrefixStore is)."""
    return [dist.PrefixStore(f"{request.node.name}/", client) for client in clients]


def expected_views(identities: Sequence[RankIdentity]) -> list[RankView]:
    """Each rank's view, worked out from group_into_machines' whole layout."""
    layout = group_into_machines(identities)
    sizes = tuple(len(ranks) for ranks in layout)
    regular = len(set(sizes)) == 1
    views = []
    for rank in range(len(identities)):
        machine = next(m for m, ranks in enumerate(layout) if rank in ranks)
        local_rank = layout[machine].index(rank)
        views.append(
            RankView(
                rank=rank,
                world_size=len(identities),
                machine=machine,
                num_machines=len(layout),
                local_ranks=tuple(layout[machine]),
                local_rank=local_rank,
                rail_peers=tuple(ranks[local_rank] for ranks in layout) if regular else (),
                regular=regular,
                machine_sizes=sizes,
            )
        )
    return views


def drive(
    steps: dict[int, Steps],
    poll: dist.Store,
    seed: int = 0,
    on_wait: Callable[[int], None] | None = None,
) -> dict[int, RankView | Exception]:
    """Runs the ranks' protocols to the end on this thread, resuming in a random order.

    A rank parks on the keys it yields until they exist (`on_wait(rank)` then
    counts the real driver's store.wait). When no parked rank can go on, none
    ever will (all ranks are here): each is told its wait timed out, as a
    real timeout would.
    """
    rng = random.Random(seed)
    results: dict[int, RankView | Exception] = {}
    parked: dict[int, list[str]] = {}

    def resume(rank: int, throw: Exception | None = None) -> None:
        parked.pop(rank, None)
        try:
            if throw is not None:
                parked[rank] = steps[rank].throw(throw)
            else:
                parked[rank] = next(steps[rank])  # next() sends None, as the real driver does
            if on_wait is not None:
                on_wait(rank)
        except StopIteration as stop:
            results[rank] = stop.value
        except Exception as error:
            results[rank] = error

    for rank in rng.sample(sorted(steps), len(steps)):
        resume(rank)
    while parked:
        present = {tuple(keys): poll.check(keys) for keys in map(tuple, parked.values())}
        ready = [rank for rank, keys in parked.items() if present[tuple(keys)]]
        if not ready:
            for rank in list(parked):
                resume(rank, WaitTimedOut("no rank can go on"))
            continue
        for rank in rng.sample(ready, len(ready)):
            resume(rank)
    return results


def drive_all(
    stores: Sequence[dist.Store],
    identities: Sequence[RankIdentity],
    settings: Sequence[dict[str, int]] | None = None,
    ranks: Sequence[int] | None = None,
    seed: int = 0,
) -> tuple[dict[int, RankView | Exception], dict[int, CountingStore]]:
    """The ranks (default: all) of a group of len(identities), counted, through `drive` on one client."""
    store = stores[0]
    size = len(identities)
    ranks = range(size) if ranks is None else ranks
    counted = {rank: CountingStore(store) for rank in ranks}
    steps = {
        rank: rendezvous_steps(
            counted[rank], rank, size, identities[rank], settings[rank] if settings else SETTINGS, TIMEOUT
        )
        for rank in ranks
    }
    return drive(steps, store, seed, lambda rank: counted[rank].calls.update(["wait"])), counted


def run_threads(
    stores: Sequence[dist.Store],
    identities: Sequence[RankIdentity],
    settings: Sequence[dict[str, int]] | None = None,
    ranks: Sequence[int] | None = None,
    timeout: timedelta = TIMEOUT,
) -> tuple[dict[int, RankView | Exception], dict[int, float]]:
    """The real `rendezvous` on a thread per rank, each with its own client; results and seconds taken."""
    size = len(identities)
    ranks = range(size) if ranks is None else ranks
    results: dict[int, RankView | Exception] = {}
    seconds: dict[int, float] = {}

    def body(rank: int) -> None:
        start = time.monotonic()
        try:
            results[rank] = rendezvous(
                stores[rank], rank, size, identities[rank], settings[rank] if settings else SETTINGS, timeout
            )
        except Exception as error:
            results[rank] = error
        seconds[rank] = time.monotonic() - start

    threads = [threading.Thread(target=body, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, seconds


def explicit(machine_of: Sequence[int], local_ranks: Sequence[int | None] | None = None) -> list[RankIdentity]:
    local_ranks = local_ranks or [None] * len(machine_of)
    return [
        RankIdentity(f"machine-{m}", MACHINE_ID, local, f"host-{m}")
        for m, local in zip(machine_of, local_ranks, strict=True)
    ]


def regular(machines: int, per_machine: int, interleaved: bool = False) -> list[RankIdentity]:
    ranks = range(machines * per_machine)
    machine_of = [r % machines if interleaved else r // per_machine for r in ranks]
    local = [r // machines if interleaved else r % per_machine for r in ranks]
    return explicit(machine_of, local)


def random_layout(rng: random.Random) -> list[RankIdentity]:
    """Machines of equal or unequal sizes, numbered in any order, LOCAL_RANK in any state, sometimes mixed sources."""
    machines = rng.randint(1, 8)
    sizes = [rng.randint(1, 6)] * machines if rng.random() < 0.5 else [rng.randint(1, 6) for _ in range(machines)]
    slots = [m for m, size in enumerate(sizes) for _ in range(size)]
    numbering = rng.choice(["machine-major", "interleaved", "shuffled"])
    if numbering == "interleaved":
        remaining, slots = list(sizes), []
        while any(remaining):
            for m in range(machines):
                if remaining[m]:
                    slots.append(m)
                    remaining[m] -= 1
    elif numbering == "shuffled":
        rng.shuffle(slots)
    mode = rng.choice(["given", "given-shuffled", "absent", "repeated", "partial"])
    local: list[int | None] = []
    seen: Counter[int] = Counter()
    for m in slots:
        index = seen[m]
        seen[m] += 1
        if mode == "given":
            local.append(index)
        elif mode == "given-shuffled":
            local.append((sizes[m] - 1 - index + m) % sizes[m])
        elif mode == "repeated":
            local.append(rng.randint(0, 1))
        elif mode == "partial":
            local.append(index if rng.random() < 0.5 else None)
        else:
            local.append(None)
    identities = explicit(slots, local)
    if rng.random() < 0.25:
        # Mixed sources: some ranks identify their machine by torchrun; hosts sometimes hold two machines.
        merge = rng.random() < 0.5
        identities = [
            RankIdentity(
                *((f"torchrun node {m}", TORCHRUN) if rng.random() < 0.4 else (i.machine_id, i.source)),
                i.local_rank,
                f"host-{m // 2 if merge else m}",
            )
            for m, i in zip(slots, identities, strict=True)
        ]
    return identities


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    messages = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    caplog.clear()
    return messages


@pytest.mark.timeout(60)
def test_random_layouts_match_group_into_machines(stores: list[dist.Store], caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(20240611)
    layouts = [explicit([0]), explicit([0, 0, 0], [2, 0, 1])] + [random_layout(rng) for _ in range(300)]
    mixed = 0
    with caplog.at_level(logging.WARNING, logger="fairring"):
        for seed, identities in enumerate(layouts):
            caplog.clear()
            expected = expected_views(identities)
            reference_warnings = warnings_of(caplog)
            results, _ = drive_all(stores, identities, seed=seed)
            assert [results[rank] for rank in range(len(identities))] == expected, identities
            # Same warning, logged once (by rank 0) instead of by every rank.
            assert warnings_of(caplog) == reference_warnings
            mixed += bool(reference_warnings)
    assert mixed >= 5, "the layouts should include mixed sources"


@pytest.mark.timeout(60)
def test_threads_with_the_real_driver(stores: list[dist.Store]) -> None:
    for identities in [regular(4, 8, interleaved=True), explicit([0, 1, 1, 2, 2, 2], [None, 1, 0, 0, 0, 1])]:
        results, _ = run_threads(stores, identities)
        assert [results[rank] for rank in range(len(identities))] == expected_views(identities)


@pytest.mark.timeout(30)
def test_settings_that_differ_fail_every_rank(stores: list[dist.Store]) -> None:
    settings = [dict(SETTINGS) for _ in range(4)]
    settings[2][SLICE_SIZE] = 1 << 20
    results, _ = run_threads(stores, regular(2, 2), settings)
    for rank in range(4):
        error = results[rank]
        assert isinstance(error, ConfigError), (rank, error)
        assert f"{SLICE_SIZE} differs across ranks" in str(error)
        assert "2: 1048576" in str(error) and ": 4194304" in str(error)


@pytest.mark.timeout(30)
def test_settings_conflict_message_is_bounded(stores: list[dist.Store]) -> None:
    size = 64
    settings = [{**SETTINGS, FLAT_THRESHOLD: rank % 3} for rank in range(size)]
    results, _ = drive_all(stores, regular(8, 8), settings)
    messages = {str(results[rank]) for rank in range(size)}
    assert len(messages) == 1 and all(isinstance(results[rank], ConfigError) for rank in range(size))
    message = messages.pop()
    # Which rank's value won depends on who came first; the message says so and stays short.
    assert f"{FLAT_THRESHOLD} differs across ranks" in message and "more ranks differ from rank" in message
    assert len(message) < 400


@pytest.mark.timeout(30)
def test_two_ranks_conflict_reads_like_check_settings_agree(stores: list[dist.Store]) -> None:
    settings = [{SLICE_SIZE: 1}, {SLICE_SIZE: 2}]
    results, _ = run_threads(stores, explicit([0, 1]), settings)
    for rank in range(2):
        assert str(results[rank]) == (
            f"fairring: {SLICE_SIZE} differs across ranks ({{0: 1, 1: 2}}); "
            "every rank of a group must use the same value"
        )


@pytest.mark.timeout(30)
def test_a_rank_that_never_joins_is_named_within_the_timeout(stores: list[dist.Store]) -> None:
    timeout = timedelta(seconds=1)
    results, seconds = run_threads(stores, regular(2, 2), ranks=[0, 1, 3], timeout=timeout)
    for rank in (0, 1, 3):
        error = results[rank]
        assert isinstance(error, TopologyError), (rank, error)
        # What NCCL's and Gloo's init raise where a rank never comes to the store.
        assert isinstance(error, dist.DistStoreError), (rank, error)
        assert str(error) == (
            f"fairring: rank {rank} waited 0:00:01 for ranks [2] of 4 to join the group; "
            "check that every rank was started and can reach the store"
        )
        assert 0.9 <= seconds[rank] < 2.5


@pytest.mark.timeout(30)
def test_many_missing_ranks_are_capped_and_counted(stores: list[dist.Store]) -> None:
    results, _ = drive_all(stores, regular(5, 8), ranks=range(0, 40, 2))
    message = str(results[0])
    missing = list(range(1, 40, 2))
    assert f"for 20 ranks ({missing[:16]} and 4 more) of 40 to join the group" in message


@pytest.mark.timeout(30)
def test_a_rank_that_stops_after_registering_is_named(stores: list[dist.Store]) -> None:
    identities = regular(3, 2, interleaved=True)
    store = stores[0]
    steps = {rank: rendezvous_steps(store, rank, 6, identities[rank], SETTINGS, TIMEOUT) for rank in range(6)}
    frozen = steps.pop(1)
    next(frozen)  # rank 1 registers and arrives, then is never resumed: it never publishes its rail entry
    results = drive(steps, store)
    for rank in (0, 2, 3, 4, 5):
        assert isinstance(results[rank], TopologyError)
        assert "for ranks [1] of 6 to join" in str(results[rank])


@pytest.mark.timeout(30)
def test_the_store_serves_consecutive_rendezvous(stores: list[dist.Store]) -> None:
    # The same group (same store, same size) meets again, with another layout and other settings.
    first, second = regular(2, 3), regular(3, 2, interleaved=True)
    results, _ = run_threads(stores, first)
    assert [results[rank] for rank in range(6)] == expected_views(first)
    results, _ = run_threads(stores, second, [{**SETTINGS, SLICE_SIZE: 1 << 20}] * 6)
    assert [results[rank] for rank in range(6)] == expected_views(second)
    results, _ = drive_all(stores, first)
    assert [results[rank] for rank in range(6)] == expected_views(first)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("interleaved", [False, True])
def test_round_trips_and_reads_do_not_grow_with_the_group(stores: list[dist.Store], interleaved: bool) -> None:
    per_machine = 8
    trips_by_role: dict[int, dict[tuple[bool, bool], set[int]]] = {}
    for machines in (2, 32):
        identities = regular(machines, per_machine, interleaved)
        results, counted = drive_all(stores, identities)
        assert [results[rank] for rank in range(len(identities))] == expected_views(identities)
        trips_by_role[machines] = {}
        for store in counted.values():
            # Roles with extra trips: the last rank to arrive (checks for dissent, sets `done`), the last to
            # publish (sets `ready`).
            role = (store.calls["check"] == 1, store.calls["set"] > store.calls["check"])
            trips_by_role[machines].setdefault(role, set()).add(sum(store.calls.values()))
            # Values: agreement, then done and members, then rail/0 and this rank's rail.
            assert store.values_read <= 5
            # Entries: L members and 2M rail entries of about 12 bytes, plus a constant (agreement, done).
            assert store.bytes_received <= 250 + 8 * per_machine + 2 * 14 * machines
    # Each role costs the same round trips in 16 ranks as in 256: 11, and at most 3 more.
    small, large = trips_by_role[2], trips_by_role[32]
    assert all(len(trips) == 1 for trips in [*small.values(), *large.values()]), trips_by_role
    assert all(small[role] == large[role] for role in small.keys() & large.keys()), trips_by_role
    assert small[(False, False)] == large[(False, False)] == {11}
    assert max(max(trips) for trips in large.values()) <= 14
