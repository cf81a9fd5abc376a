"""Soak: thousands of random collectives through fairring, each checked, with threads, descriptors and memory flat.

Every rank of a RankPool (harness.py) draws the same sequence from one seed
and checks every result; the ranks' code is soak_driver.py, which says what
they run and check. tests/test_soak.py is the short run; this is the long one:

    python benchmarks/soak.py --minutes 10             # or: make soak
    python benchmarks/soak.py --ops 50000 --seed 3 --layout 3x2-interleaved
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script: the checkout's root, for `benchmarks` and the in-place build.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import InitSpec, Layout, RankPool  # noqa: E402
from benchmarks.soak_driver import MiB, Plan, growth_problems, run_rank, summary  # noqa: E402


def parse_layout(text: str) -> Layout:
    shape, _, suffix = text.partition("-")
    machines, ranks = (int(part) for part in shape.split("x"))
    if suffix not in ("", "interleaved"):
        raise argparse.ArgumentTypeError(f"layout {text!r}: expected MxR or MxR-interleaved, e.g. 2x2")
    return Layout(machines, ranks, interleaved=suffix == "interleaved")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=0, help="operations to run (0: until --minutes)")
    parser.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0: after --ops)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout", type=parse_layout, default=Layout(2, 2), help="machines x ranks, e.g. 2x2")
    parser.add_argument("--warmup-ops", type=int, default=3000, help="operations before the reference point")
    parser.add_argument("--max-mib", type=float, default=4.0, help="largest tensor, MiB")
    args = parser.parse_args()
    if args.ops <= 0 and args.minutes <= 0:
        parser.error("give --ops or --minutes")
    plan = Plan(args.ops, args.seed, args.minutes, args.warmup_ops, int(args.max_mib * MiB))
    # The ranks inherit this. OpenMP gives each thread that runs a large ATen op a team of
    # OMP_NUM_THREADS - 1 workers for as long as that thread lives, so with more than one the
    # count grows whenever another engine, Gloo or completion thread first reduces a large
    # tensor: threads would be flat only once every thread had. One makes the count exact.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # An op may wait behind every other op of its batch: give it time on a loaded machine.
    spec = InitSpec(timeout=InitSpec().timeout * 2)
    budget = args.minutes * 60 + 600 if args.minutes > 0 else 600 + args.ops * 0.5
    print(f"soak: {args.layout}, {plan}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}", flush=True)
    with RankPool(args.layout, spec) as ranks:
        reports = ranks.run(run_rank, plan, timeout=budget)
    print(summary(plan, reports))
    problems = [problem for report in reports for problem in growth_problems(report)]
    problems += [f"{report.failure_count} wrong results on rank {report.rank}" for report in reports if report.failures]
    print("\n".join(problems) if problems else "soak: every result checked and correct; threads, fds and RSS flat")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
