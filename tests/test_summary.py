"""fairring.summary(group) and the line said at destroy_process_group (fairring/summary.py).

Every count is checked against what the test itself issued, every derived
figure against a plain computation of the counts and the NIC rate given, and
the time saved against auto's own sweep, at one of the sizes it measured.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import fairring
from benchmarks.harness import InitSpec, Layout, RankPool

LAYOUT = Layout(2, 2)
THRESHOLD = {"FAIRRING_FLAT_THRESHOLD": "64KiB"}
KiB, MiB = 1024, 1024 * 1024
SMALL, LARGE, IN_FLIGHT = 1 * KiB, 1 * MiB, 256 * KiB


def floats(nbytes: int) -> torch.Tensor:
    return torch.ones(nbytes // 4) * (dist.get_rank() + 1)


def issue_known_collectives() -> dict[str, object]:
    """A known mix of kinds, paths and sizes; returns what it issued, the summaries and its wall time."""
    world = dist.get_world_size()
    started = time.monotonic()
    for _ in range(5):
        dist.all_reduce(floats(SMALL))  # below the threshold: Gloo
    for _ in range(3):
        dist.all_reduce(floats(LARGE))  # the engine
    works = [dist.all_reduce(floats(IN_FLIGHT), async_op=True) for _ in range(4)]
    for work in works:
        work.wait()
    for _ in range(2):
        output = torch.empty(LARGE // 4 // world)
        dist.reduce_scatter_tensor(output, floats(LARGE))
        gathered = torch.empty(LARGE // 4)
        dist.all_gather_into_tensor(gathered, floats(LARGE // world))
    dist.broadcast(floats(SMALL), src=0)  # not one of the kinds counted
    wall = time.monotonic() - started
    # A future wakes its waiters before it runs its callbacks, one of which ends the op's interval:
    # the last op's may land just after the wait returned.
    deadline = time.monotonic() + 5
    while not all(row.timed_ops == row.ops for row in fairring.summary().rows) and time.monotonic() < deadline:
        time.sleep(0.01)
    given = fairring.summary(nic_gbps=1)
    return {"wall": wall, "rows": [vars(row) for row in given.rows], "line": given.line(), "sysfs": fairring.summary()}


def test_counts_bytes_and_times_each_kind_and_path() -> None:
    with RankPool(LAYOUT, InitSpec(extra_env=THRESHOLD)) as pool:
        results = pool.run(issue_known_collectives)
    expected = {
        ("all_reduce", "gloo"): (5, 5 * SMALL),
        ("all_reduce", "engine"): (7, 3 * LARGE + 4 * IN_FLIGHT),
        ("reduce_scatter", "engine"): (2, 2 * LARGE),
        ("all_gather", "engine"): (2, 2 * LARGE),
    }
    for rank, result in enumerate(results):
        rows = {(row["collective"], row["path"]): row for row in result["rows"]}
        assert {key: (row["ops"], row["bytes"]) for key, row in rows.items()} == expected, rank
        for (collective, _), row in rows.items():
            assert row["device"] == "cpu" and row["timed_ops"] == row["ops"], row
            # At least one op in flight for no longer than the test's own loop took.
            assert 0 < row["busy_s"] <= result["wall"], (row, result["wall"])
            assert row["bytes_per_s"] == pytest.approx(row["bytes"] / row["busy_s"])
            passes = 2 if collective == "all_reduce" else 1
            bound_s = passes * (LAYOUT.machines - 1) / LAYOUT.machines * row["bytes"] / (1e9 / 8)
            assert row["of_bound"] == pytest.approx(bound_s / row["busy_s"])
            assert row["saved_s"] is None  # a threshold that was set, not measured
        assert "cpu all_reduce: engine 7 ops 4 MiB in " in result["line"] and ", gloo 5 ops 5 KiB in " in result["line"]
        assert "1 Gbit/s per machine (given)" in result["line"]
        # Loopback reports no speed: no fraction, and the reason.
        assert all(row.of_bound is None for row in result["sysfs"].rows)
        assert "the kernel reports no speed for lo (summary's nic_gbps sets it)" in result["sysfs"].bound


def sized_all_reduces(nbytes: int, count: int) -> dict[str, object]:
    """`count` all-reduces of `nbytes` on an auto group (the first measures); the sweep and the summary."""
    for _ in range(count):
        dist.all_reduce(floats(nbytes))
    return {
        "sweep": fairring.backend_of().measured_threshold("cpu"),
        "rows": [vars(row) for row in fairring.summary().rows],
    }


def test_time_saved_is_read_from_autos_sweep(tmp_path: Path) -> None:
    auto = {"FAIRRING_FLAT_THRESHOLD": "auto", "FAIRRING_AUTO_BUDGET": "3", "FAIRRING_AUTO_CACHE": str(tmp_path)}
    with RankPool(LAYOUT, InitSpec(extra_env=auto)) as pool:
        results = pool.run(sized_all_reduces, 4 * KiB, 3)
    for result in results:
        # 4 KiB is the sweep's first size, always measured.
        [measured] = [size for size in result["sweep"]["sizes"] if size["bytes"] == 4 * KiB]
        [row] = result["rows"]
        assert (row["collective"], row["ops"], row["bytes"]) == ("all_reduce", 3, 3 * 4 * KiB)
        gain = measured["delegate_s"] - measured["engine_s"]
        assert row["saved_s"] == pytest.approx(3 * (gain if row["path"] == "engine" else -gain))


def said_at_destroy() -> list[str]:
    """What the fairring logger said while destroy_process_group ran, at INFO."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    logger = logging.getLogger("fairring")
    logger.setLevel(logging.INFO)
    logger.addHandler(Keep())
    dist.all_reduce(floats(LARGE))
    dist.destroy_process_group()
    return [text for text in said if "what fairring did" in text]


def test_destroy_process_group_says_it_once_from_rank_0() -> None:
    with RankPool(LAYOUT, InitSpec(extra_env=THRESHOLD)) as pool:
        said = pool.run(said_at_destroy)
    [line] = said[0]
    # (Its time may not be in yet: the wait can return before the future's callback ends the interval.)
    assert "rank 0: cpu all_reduce: engine 1 ops 1 MiB" in line, line
    # The others say it at DEBUG, below the level set.
    assert said[1:] == [[]] * (LAYOUT.world_size - 1)


def test_many_fast_ops_are_each_counted_and_timed() -> None:
    """Ops whose Work completed before they were counted (the callback runs at once) are all folded in;
    the binding fails otherwise. What it costs is benchmarks/summary_cost.py's to say, not a test's."""
    assert 0 < fairring._C._testing.usage_seconds_per_op(20_000) < 1
