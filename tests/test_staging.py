"""The staging ring on its own: placement, wrap-around, out-of-order release, bounds."""

from __future__ import annotations

import random

import pytest

from fairring import _C


def test_leases_are_aligned_and_sized_to_the_request() -> None:
    ring = _C._testing.StagingRing(1000)
    assert ring.stats()["capacity_bytes"] == 960  # rounded down to 64-byte lines
    first = ring.try_acquire(1)
    second = ring.try_acquire(100)
    assert (first.offset, first.size) == (0, 64)
    assert (second.offset, second.size) == (64, 128)


def test_leases_wrap_around_once_the_oldest_is_back() -> None:
    ring = _C._testing.StagingRing(1024)
    a = ring.try_acquire(384)
    b = ring.try_acquire(384)
    assert (a.offset, b.offset) == (0, 384)
    assert ring.try_acquire(384) is None  # 256 bytes left at the end, none at the start
    a.release()
    c = ring.try_acquire(384)
    assert c.offset == 0  # wrapped; the end stays unused meanwhile
    assert ring.try_acquire(64) is None  # between c's end and b's start: nothing
    b.release()
    d = ring.try_acquire(256)
    assert d.offset == 384
    stats = ring.stats()
    assert (stats["bytes_in_use"], stats["leases_in_use"], stats["leases_granted"]) == (640, 2, 4)
    assert stats["peak_bytes_in_use"] == 768


def test_space_freed_out_of_order_is_reused_once_older_leases_are_back() -> None:
    ring = _C._testing.StagingRing(768)
    a, b, c = (ring.try_acquire(256) for _ in range(3))
    b.release()  # as on failure: younger first
    assert ring.stats()["bytes_in_use"] == 512
    assert ring.try_acquire(256) is None  # b's bytes wait behind a
    a.release()
    assert ring.try_acquire(512).offset == 0
    del c


def test_a_request_larger_than_the_ring_names_the_variable() -> None:
    ring = _C._testing.StagingRing(4096)
    with pytest.raises(RuntimeError, match="FAIRRING_TOTAL_MEMORY"):
        ring.try_acquire(4097)


def test_random_fifo_use_never_overlaps_and_never_exceeds_capacity() -> None:
    capacity = 64 * 100
    ring = _C._testing.StagingRing(capacity)
    rng = random.Random(7)
    live: list = []
    granted = 0
    for _ in range(5000):
        if live and (rng.random() < 0.45 or len(live) > 20):
            # Mostly oldest first, as the engine releases; sometimes any.
            index = 0 if rng.random() < 0.8 else rng.randrange(len(live))
            live.pop(index).release()
            continue
        lease = ring.try_acquire(rng.randint(1, capacity // 3))
        if lease is None:
            continue
        granted += 1
        assert 0 <= lease.offset and lease.offset + lease.size <= capacity
        for other in live:
            assert lease.offset + lease.size <= other.offset or other.offset + other.size <= lease.offset
        live.append(lease)
        stats = ring.stats()
        assert stats["bytes_in_use"] == sum(held.size for held in live) <= capacity
        assert stats["leases_in_use"] == len(live)
    for lease in live:
        lease.release()
    stats = ring.stats()
    assert (stats["bytes_in_use"], stats["leases_in_use"], stats["leases_granted"]) == (0, 0, granted)
    assert ring.try_acquire(capacity).offset == 0  # all of it is back


@pytest.mark.parametrize(
    ("slice_bytes", "local_size", "machines", "unpadded", "padded"),
    [
        (4096, 2, 2, 3 * 2048, 5 * 2048),  # parts (2 slots), shards (1 slot), padded copy (2 slots)
        (4096, 1, 2, 2 * 4096, 3 * 4096),  # one rank per machine: the slot is in staging too
        (3000, 3, 2, 4 * 1024, 7 * 1024),  # slots of 1000 bytes, each part 64-byte aligned
    ],
)
def test_a_lease_holds_parts_shards_and_for_a_padded_slice_its_copy(
    slice_bytes: int, local_size: int, machines: int, unpadded: int, padded: int
) -> None:
    assert _C.staging_bytes_for(slice_bytes, local_size, machines, padded=False) == unpadded
    assert _C.staging_bytes_for(slice_bytes, local_size, machines, padded=True) == padded


def replay_fits(capacity: int, leases: list[int], window: int) -> bool:
    """Whether the real ring grants every lease at once when lease s waits only for lease s - window."""
    ring = _C._testing.StagingRing(capacity)
    held: list = []
    for size in leases:
        if len(held) == window:
            held.pop(0).release()
        lease = ring.try_acquire(size)
        if lease is None:
            return False
        held.append(lease)
    return True


def test_the_window_of_equal_leases_is_as_many_as_the_ring_holds() -> None:
    assert _C._testing.staging_window(4 * 6144, [6144] * 10) == 4
    assert _C._testing.staging_window(4 * 6144, [6144] * 3) == 3  # no more than there are
    assert _C._testing.staging_window(6144, [6144] * 5) == 1
    assert _C._testing.staging_window(4096, []) == 1


def test_a_larger_last_lease_narrows_the_window() -> None:
    # Three of 1024 fill the ring; a padded last one of 2048 would wait for a later release.
    leases = [1024] * 6 + [2048]
    window = _C._testing.staging_window(3 * 1024, leases)
    assert window < 3 and replay_fits(3 * 1024, leases, window)
    assert not replay_fits(3 * 1024, leases, 3)


def test_the_window_is_the_largest_the_real_ring_never_blocks() -> None:
    """Random lease lists: the ring grants every lease under the window, and not under one more."""
    rng = random.Random(11)
    for _ in range(300):
        capacity = 64 * rng.randint(8, 200)
        full = rng.randint(1, capacity // 64) * 64
        leases = [full] * rng.randint(1, 12) + [rng.randint(1, capacity)]
        window = _C._testing.staging_window(capacity, leases)
        assert 1 <= window <= len(leases)
        assert replay_fits(capacity, leases, window), (capacity, leases, window)
        if window < len(leases):
            assert not replay_fits(capacity, leases, window + 1), (capacity, leases, window)


def test_the_window_holds_only_from_an_empty_ring() -> None:
    """A lease an earlier op keeps for a resend shifts the ring: the window's replay then blocks."""
    capacity, leases = 3 * 1024, [1024] * 6
    window = _C._testing.staging_window(capacity, leases)
    assert window == 3 and replay_fits(capacity, leases, window)
    ring = _C._testing.StagingRing(capacity)
    kept = ring.try_acquire(512)  # the previous op's last slice, not yet acknowledged
    first = ring.try_acquire(1024)
    assert first.offset == 512
    second = ring.try_acquire(1024)
    assert ring.try_acquire(1024) is None  # the window's third lease waits for the first: a cycle
    for lease in (first, second):
        lease.release()
    assert ring.try_acquire(1024, empty_ring=True) is None  # what the launch order's first slice does
    kept.release()
    first = ring.try_acquire(1024, empty_ring=True)
    assert first.offset == 0  # where the replay starts
    assert ring.try_acquire(1024) is not None and ring.try_acquire(1024) is not None
