"""Where one engine op's time goes, stage by stage (`make op-breakdown`).

Runs synchronous ops of one collective on 2 machines x 2 ranks emulated on
loopback, each after a barrier, with the engine's timeline on
(FAIRRING_TIMELINE), and Gloo's own op on the same tensors in the same
processes. For each size it prints, from the median op of the slowest rank,
when each stage's steps ran, in ms since the op was issued: the local
reduce-scatter and sends (steps 1-2), the reduction and sends back (3-4), the
local all-gather (5), and when wait() returned. A stage's span includes what
it waited for inside (a peer's shards, a local peer's part), so where a
stage starts late, what came before it was late. On loopback the CPUs, not a
network, are the limit: what shows is fairring's own cost.

With --emulated the engine runs on the emulated device as the CUDA engine does
by default: it launches every step ahead of the network and wait() makes the
caller's (emulated) stream wait, not the host. An op is then done when that
stream is, and a column says when wait() returned.

    python benchmarks/op_breakdown.py                                   # all three, 256 KiB to 4 MiB
    python benchmarks/op_breakdown.py --collective all_gather --sizes 4MiB --iters 50
    python benchmarks/op_breakdown.py --emulated --collective all_reduce

Per-stage CPU profiles (`perf record -a -g` while this runs, `perf report
--sort comm,sym`) name the code: the stage threads are fr-rs-stage,
fr-reduce-stage and fr-ag-stage, TensorPipe's TP_UV_loop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import InitSpec, Layout, RankPool, wait_for_emulated_callers_stream
from fairring._sizes import format_size, parse_size
from fairring.bench.collectives import COLLECTIVES
from fairring.bench.timeline import STAGES, engine_slices, load_events

# The emulated device launching ahead: Gloo's local steps stand for NCCL's, no jitter.
EMULATED = {"FAIRRING_TEST_EMULATED_DEVICE": "seed=1,jitter_us=0,caller_stream", "FAIRRING_SHM_DISABLE": "1"}


def time_ops(collective: str, sizes: list[int], iters: int, warmup: int) -> dict[int, dict[str, list]]:
    """Per size: fairring's ops as (issued, done, wait returned) wall-clock seconds, and Gloo's op times."""
    gloo = dist.new_group(backend="gloo")
    timed: dict[int, dict[str, list]] = {}
    for nbytes in sizes:
        buffers = COLLECTIVES[collective].buffers(nbytes, dist.get_world_size(), None)
        windows, gloo_s = [], []
        for iteration in range(warmup + iters):
            for group in (dist.group.WORLD, gloo):
                dist.barrier(group=gloo)
                issued = time.time()
                COLLECTIVES[collective].issue(buffers, group).wait()
                returned = time.time()
                wait_for_emulated_callers_stream()
                done = time.time()
                if iteration < warmup:
                    continue
                if group is gloo:
                    gloo_s.append(done - issued)
                else:
                    windows.append((issued, done, returned))
        timed[nbytes] = {"windows": windows, "gloo_s": gloo_s}
    return timed


def spans_by_rank(folder: Path) -> dict[int, list[dict]]:
    """Every stage span of the busiest engine (the world group's), by rank: {stage, start, end} in seconds."""
    _, slices = engine_slices(load_events([folder]))
    spans: dict[int, list[dict]] = defaultdict(list)
    for event in slices:
        start = event["ts"] / 1e6
        spans[event["pid"]].append({"stage": event["name"], "start": start, "end": start + event["dur"] / 1e6})
    return spans


def breakdown(window: tuple[float, float, float], spans: list[dict]) -> dict[str, float]:
    """One rank's op: each stage's first start and last end, the op's end and wait()'s, in ms since its issue."""
    issued, done, returned = window
    inside = [span for span in spans if issued <= span["start"] <= done]
    row = {"op": (done - issued) * 1e3, "wait": (returned - issued) * 1e3}
    for stage in STAGES:
        mine = [span for span in inside if span["stage"] == stage]
        if mine:
            row[f"{stage} from"] = (min(span["start"] for span in mine) - issued) * 1e3
            row[f"{stage} to"] = (max(span["end"] for span in mine) - issued) * 1e3
    return row


def report(collective: str, results: list[dict], folder: Path, where: str) -> None:
    spans = spans_by_rank(folder)
    print(
        f"\n{collective}, 2 machines x 2 ranks on loopback, {where}; ms since issue, the median op of the slowest rank"
    )
    columns = f"{'size':>8} {'gloo':>7} {'fairring':>8} {'vs gloo':>7} {'wait()':>7}  "
    print(columns + "  ".join(f"{s:>15}" for s in STAGES))
    for nbytes in results[0]:
        per_rank = []
        for rank, result in enumerate(results):
            rows = [breakdown(window, spans.get(rank, [])) for window in result[nbytes]["windows"]]
            per_rank.append(sorted(rows, key=lambda row: row["op"])[len(rows) // 2])
        slowest = max(per_rank, key=lambda row: row["op"])
        gloo_ms = (
            statistics.median(max(times) for times in zip(*(r[nbytes]["gloo_s"] for r in results), strict=True)) * 1e3
        )
        stages = [
            f"{slowest.get(f'{s} from', float('nan')):6.2f}-{slowest.get(f'{s} to', float('nan')):6.2f}" for s in STAGES
        ]
        ratio = gloo_ms / slowest["op"]
        print(
            f"{format_size(nbytes):>8} {gloo_ms:7.2f} {slowest['op']:8.2f} {ratio:6.2f}x {slowest['wait']:7.2f}  "
            + "  ".join(f"{s:>15}" for s in stages)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collective", choices=[*COLLECTIVES, "all"], default="all")
    parser.add_argument("--sizes", default="256KiB,1MiB,4MiB")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="VAR=VALUE", help="environment for the ranks")
    parser.add_argument("--emulated", action="store_true", help="the emulated device, launching ahead as CUDA does")
    args = parser.parse_args()
    sizes = [parse_size("--sizes", size) for size in args.sizes.split(",")]
    collectives = list(COLLECTIVES) if args.collective == "all" else [args.collective]
    env = {**(EMULATED if args.emulated else {}), **dict(item.split("=", 1) for item in args.set)}
    where = "the emulated device launching ahead" if args.emulated else "CPU"
    # As torchrun runs ranks that share a machine's cores (and `python -m fairring.bench` does).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for collective in collectives:
        with tempfile.TemporaryDirectory(prefix="fairring-breakdown-") as folder:
            spec = InitSpec(extra_env={**env, "FAIRRING_TIMELINE": folder})
            with RankPool(Layout(2, 2), spec) as pool:
                results = pool.run(time_ops, collective, sizes, args.iters, args.warmup)
            report(collective, results, Path(folder), where)


if __name__ == "__main__":
    main()
