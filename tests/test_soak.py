"""The short soak: about 1,000 random collectives on 2 machines x 2 ranks, each checked against plain
torch arithmetic on every rank's input, with threads, descriptors and memory flat after a warm-up.

The ranks' code is benchmarks/soak_driver.py; the long run outside CI (`make soak`) is benchmarks/soak.py.
"""

from __future__ import annotations

import pytest

from benchmarks.harness import InitSpec, Layout, RankPool
from benchmarks.soak_driver import MiB, Plan, growth_problems, run_rank, summary
from nixl_support import needs_nixl, rails_env

# 1,000 operations, the growth checks from a warm-up at 300 (`make soak` runs for minutes).
PLAN = Plan(ops=1000, seed=11, warmup_ops=300, max_bytes=4 * MiB)


# On NIXL rails in CI: 500 operations, the growth checks from a warm-up at 100.
NIXL_PLAN = Plan(ops=500, seed=12, warmup_ops=100, max_bytes=4 * MiB)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("transport", "plan"), [("tensorpipe", PLAN), pytest.param("nixl", NIXL_PLAN, marks=needs_nixl)]
)
def test_thousands_of_random_collectives_are_correct_and_leave_nothing_behind(
    monkeypatch: pytest.MonkeyPatch, transport: str, plan: Plan
) -> None:
    # The ranks inherit it: with OpenMP's usual team per thread, threads would grow whenever
    # another long-lived thread first reduces a large tensor (see benchmarks/soak.py's main).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with RankPool(Layout(2, 2), InitSpec(extra_env=rails_env(transport))) as ranks:
        reports = ranks.run(run_rank, plan, timeout=240)
    print(summary(plan, reports))
    assert all(report.ops >= plan.ops for report in reports)
    assert [failure for report in reports for failure in report.failures] == []
    # Threads and descriptors must not grow at all once idle completion workers have left; RSS,
    # read after malloc_trim, by at most RSS_GROWTH_LIMIT (see benchmarks/soak_driver.py for what was measured).
    assert [problem for report in reports for problem in growth_problems(report)] == []
    # Both paths had traffic: the world group's engine, and the threshold group's engine and delegate.
    stats = reports[0].end_stats
    assert stats["engine"]["engine_ops"] and stats["flat"]["engine_ops"] and stats["flat"]["delegated_ops"], stats
