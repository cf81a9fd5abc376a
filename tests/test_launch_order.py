"""The engine's launch order on its own (csrc/engine/launch_order.h).

Two stage threads, the reduce-scatter one and the all-gather one, try their
next launch whenever they like; whatever the schedule, the launches must come
out in the one order that depends on slice numbers only, so that every rank
of a machine launches its local steps in the same order.
"""

from __future__ import annotations

import random

from fairring import _C


def expected_order(ops: list[tuple[int, int]]) -> list[tuple[str, int, int]]:
    """The documented order: per op, RS 0..W-1, then AG j followed by RS j+W."""
    order = []
    for op, (slices, window) in enumerate(ops):
        order += [("rs", op, s) for s in range(window)]
        for j in range(slices):
            order.append(("ag", op, j))
            if j + window < slices:
                order.append(("rs", op, j + window))
    return order


def run_schedule(ops: list[tuple[int, int]], rng: random.Random) -> list[tuple[str, int, int]]:
    """Launches made when the two threads try in an order `rng` picks."""
    order = _C._testing.LaunchOrder()
    for op, (slices, window) in enumerate(ops):
        order.issued(op, slices, window)
    todo = {
        "rs": [(op, s) for op, (slices, _) in enumerate(ops) for s in range(slices)],
        "ag": [(op, s) for op, (slices, _) in enumerate(ops) for s in range(slices)],
    }
    launched: list[tuple[str, int, int]] = []
    stalls = 0
    while todo["rs"] or todo["ag"]:
        step = rng.choice([name for name in todo if todo[name]])
        op, index = todo[step][0]
        # The all-gather of a slice has its data only once the slice was reduce-scattered.
        ready = step == "rs" or ("rs", op, index) in launched
        if ready and order.is_next(step, op, index):
            order.launched(step)
            launched.append((step, op, index))
            todo[step].pop(0)
            stalls = 0
        else:
            stalls += 1
            assert stalls < 1000, f"no thread may launch after {launched}"
    assert order.drained()
    return launched


def test_any_schedule_launches_in_the_one_order() -> None:
    rng = random.Random(3)
    for _ in range(200):
        ops = []
        for _ in range(rng.randint(1, 4)):
            slices = rng.randint(1, 9)
            ops.append((slices, rng.randint(1, slices)))
        assert run_schedule(ops, rng) == expected_order(ops), ops


def test_a_later_op_waits_for_the_last_all_gather_of_the_one_before() -> None:
    order = _C._testing.LaunchOrder()
    order.issued(0, 2, 2)
    order.issued(1, 1, 1)
    for step, index in [("rs", 0), ("rs", 1), ("ag", 0)]:
        assert not order.is_next("rs", 1, 0)
        assert order.is_next(step, 0, index)
        order.launched(step)
    assert not order.is_next("rs", 1, 0) and not order.drained()
    order.launched("ag")
    assert order.is_next("rs", 1, 0)


def test_a_foreign_launch_takes_its_place_between_ops() -> None:
    """A delegated all-reduce issued between two ops launches after every step of the first and
    before any of the second, and stays next until it is launched."""
    order = _C._testing.LaunchOrder()
    order.issued(0, 1, 1)
    order.issued_foreign()
    order.issued(1, 1, 1)
    assert not order.foreign_next()
    order.launched("rs")
    assert not order.foreign_next()
    order.launched("ag")
    assert order.foreign_next() and not order.is_next("rs", 1, 0) and not order.drained()
    order.launched_foreign()
    assert not order.foreign_next() and order.is_next("rs", 1, 0)
    order.launched("rs")
    order.launched("ag")
    assert order.drained()


def test_a_foreign_launch_with_nothing_before_it_is_next_at_once() -> None:
    order = _C._testing.LaunchOrder()
    order.issued_foreign()
    assert order.foreign_next()
    order.issued(0, 2, 1)
    assert not order.is_next("rs", 0, 0)
    order.launched_foreign()
    assert order.is_next("rs", 0, 0)
