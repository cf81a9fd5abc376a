"""fairring.summary(group) and the line said at destroy_process_group (fairring/_summary.py).

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
        # Why each went where it did: the delegate's all-reduces were below the threshold.
        assert {key: row["by_reason"] for key, row in rows.items()} == {
            ("all_reduce", "gloo"): {"below_threshold": 5},
            ("all_reduce", "engine"): {"engine": 7},
            ("reduce_scatter", "engine"): {"engine": 2},
            ("all_gather", "engine"): {"engine": 2},
        }
        assert "cpu all_reduce: engine 7 ops 4 MiB in " in result["line"]
        assert ", gloo 5 ops 5 KiB (below_threshold 5) in " in result["line"]
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


# (nbytes, dtype, device) each rank asks path_for about, then issues where it can.
ASKED = [
    (1 * MiB, torch.float32, "cpu"),  # the engine
    (SMALL, torch.float32, "cpu"),  # below 64 KiB
    (1 * MiB, torch.bool, "cpu"),  # the engine reduces no bool (Gloo does)
    (1 * MiB, torch.complex64, "cpu"),  # torch hands the backend its float32 view: the engine
    (1 * MiB, torch.float32, "cuda"),  # FAIRRING_CUDA_ENGINE unset: off
]


def paths_asked_then_counted() -> dict[str, object]:
    """What path_for says for each of ASKED, and for each CPU one, the reason the counters record for it."""
    backend = fairring.backend_of()
    answers = [backend.path_for(nbytes, dtype, device) for nbytes, dtype, device in ASKED]
    chunked = backend.path_for(1 * MiB, torch.float32, "cpu", "reduce_scatter")
    counted = []
    for nbytes, dtype, device in ASKED:
        if device != "cpu":
            continue
        before = {row["path"]: dict(row["by_reason"]) for row in backend.usage() if row["collective"] == "all_reduce"}
        dist.all_reduce(torch.ones(nbytes // torch.empty(0, dtype=dtype).element_size(), dtype=dtype))
        after = {row["path"]: dict(row["by_reason"]) for row in backend.usage() if row["collective"] == "all_reduce"}
        grown = [
            (path, reason)
            for path, reasons in after.items()
            for reason, ops in reasons.items()
            if ops > before.get(path, {}).get(reason, 0)
        ]
        counted.append(grown)
    return {"answers": answers, "chunked": chunked, "counted": counted}


def test_path_for_says_the_path_and_the_reason_the_counters_then_record() -> None:
    with RankPool(LAYOUT, InitSpec(extra_env=THRESHOLD)) as pool:
        results = pool.run(paths_asked_then_counted)
    expected = [
        {"path": "engine", "reason": "engine"},
        {"path": "delegate", "reason": "below_threshold"},
        {"path": "delegate", "reason": "dtype_or_op"},
        {"path": "engine", "reason": "engine"},
        {"path": "delegate", "reason": "cuda_engine_off"},
    ]
    for result in results:
        assert result["answers"] == expected
        assert result["chunked"] == {"path": "engine", "reason": "engine"}
        # The counters, from the all-reduces themselves, agree with the query.
        assert result["counted"] == [
            [("engine", "engine")],
            [("delegate", "below_threshold")],
            [("delegate", "dtype_or_op")],
            [("engine", "engine")],
        ]


def path_of_one_mib() -> dict[str, str]:
    return fairring.backend_of().path_for(1 * MiB, torch.float32)


def test_a_group_on_one_machine_says_it_is_irregular() -> None:
    # Every rank on one machine: nothing for the rails to do, so nothing ever goes to the engine.
    with RankPool(Layout(1, 2), InitSpec()) as pool:
        results = pool.run(path_of_one_mib)
    assert results == [{"path": "delegate", "reason": "irregular_group"}] * 2


def test_before_auto_measures_the_path_is_undecided(tmp_path: Path) -> None:
    auto = {"FAIRRING_FLAT_THRESHOLD": "auto", "FAIRRING_AUTO_CACHE": str(tmp_path)}
    with RankPool(LAYOUT, InitSpec(extra_env=auto)) as pool:
        results = pool.run(path_of_one_mib)
    assert results == [{"path": "undecided", "reason": "to_be_measured"}] * 4


@pytest.mark.parametrize(
    ("machines", "rank", "said"),
    [
        ([[0, 1, 2]], 0, "ranks on 1 machine(s) of 3 rank(s)"),  # one machine
        ([[0, 1], [2]], 0, "ranks on 2 machine(s) of 2, 1 rank(s)"),  # uneven machines
        ([[0, 1], [2]], 1, None),  # said once, by the group's rank 0
        ([[0, 1], [2, 3]], 0, None),  # the engine serves it
    ],
)
def test_a_group_the_engine_never_serves_says_so_at_info(
    machines: list[list[int]], rank: int, said: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    from fairring import _C
    from fairring._registration import log_if_never_on_engine

    with caplog.at_level(logging.INFO, logger="fairring"):
        log_if_never_on_engine("g", _C.Topology(rank, machines))
    lines = [record.getMessage() for record in caplog.records]
    if said is None:
        assert lines == []
    else:
        assert len(lines) == 1 and said in lines[0] and "go to the delegate" in lines[0], lines
