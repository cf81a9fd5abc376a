"""A rail's NIC down and back up under a stream of all-reduces: bandwidth and bytes by NIC, through the episode.

Two emulated machines of two ranks, each a host with two NICs (eth0, eth1) on two
networks, each NIC shaped to --rate; rail 0 on eth0, rail 1 on eth1. First the
cost of failover when nothing fails (its acknowledgements): all-reduces with
FAIRRING_RAIL_FAILOVER=1 and =0, timed alike. Then the episode: all-reduces
without pause while machine 1's eth1 goes down at --down-at seconds and up at
--up-at; every result is checked (failover_driver.py). It prints, per
half second, the all-reduces done, their bandwidth, and what each NIC sent.

    python benchmarks/failover_episode.py            # or: make failover-episode
    python benchmarks/failover_episode.py --rate 200mbit --size 16MiB
    python benchmarks/failover_episode.py --episodes 10       # many episodes: 20 switches
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script: the checkout's root, for `benchmarks` and the in-place build.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.failover_driver import all_reduces, all_reduces_for, bytes_sent, prepare, rails  # noqa: E402
from benchmarks.harness import InitSpec, Layout, RankPool  # noqa: E402
from fairring._sizes import parse_rate, parse_size  # noqa: E402
from fairring.bench.netns import NetnsCluster, netns_available  # noqa: E402

LAYOUT = Layout(2, 2)
BUCKET_S = 0.5


def pool(cluster: NetnsCluster, failover: bool) -> RankPool:
    env = {
        "FAIRRING_SOCKET_IFNAME": "eth",
        "FAIRRING_RAILS_TRANSPORT": "tensorpipe",
        "FAIRRING_RAIL_FAILOVER": str(int(failover)),
    }
    spec = InitSpec(method="tcp", host=cluster.hosts[0].address, port=29500, timeout=timedelta(seconds=60))
    return RankPool(LAYOUT, spec=spec, hosts=cluster.hosts, rank_env={r: env for r in range(LAYOUT.world_size)})


def steady(cluster: NetnsCluster, size: int, iters: int) -> dict[bool, float]:
    """Median seconds per all-reduce with failover on and off, nothing failing."""
    medians = {}
    for failover in (True, False):
        with pool(cluster, failover) as ranks:
            ranks.run(prepare, size)
            ranks.run(all_reduces, 3)
            times = ranks.run(all_reduces, iters)
            medians[failover] = statistics.median(max(t[i][1] for t in times) for i in range(iters))
    return medians


def episode(cluster: NetnsCluster, size: int, seconds: float, down_at: float, up_at: float, episodes: int) -> None:
    samples: list[tuple[float, dict[str, list[int]]]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.time(), bytes_sent(cluster)))
            stop.wait(BUCKET_S)

    with pool(cluster, True) as ranks:
        ranks.run(prepare, size)
        ranks.run(all_reduces, 3)
        result: dict[str, object] = {}

        def reduce() -> None:
            try:
                result["times"] = ranks.run(all_reduces_for, episodes * seconds, timeout=episodes * seconds + 120)
            except BaseException as error:  # reported below
                result["error"] = error

        sampler = threading.Thread(target=sample)
        worker = threading.Thread(target=reduce)
        start = time.time()
        sampler.start()
        worker.start()
        for number in range(episodes):
            time.sleep(max(0.0, start + number * seconds + down_at - time.time()))
            cluster.set_link(cluster.hosts[1], "eth1", up=False)
            time.sleep(up_at - down_at)
            cluster.set_link(cluster.hosts[1], "eth1", up=True)
        worker.join()
        stop.set()
        sampler.join()
        if "error" in result:
            raise SystemExit(f"the episode failed: {result['error']}")
        described = ranks.run(rails)
    ends = sorted(end for end, _ in result["times"][0])
    print(
        f"\n{episodes} episode(s) of {seconds:g} s: eth1 of machine 1 down at {down_at:g} s, up at {up_at:g} s "
        f"into each; {len(ends)} all-reduces, all checked"
    )
    print(f"{'from s':>7} {'all-reduces':>11} {'GB/s':>6}   sent MB/s by host: eth0 | eth1")
    for (t0, before), (t1, after) in itertools.pairwise(samples):
        done = sum(t0 < end <= t1 for end in ends)
        rates = {
            i: " ".join(f"{(a - b) / (t1 - t0) / 1e6:6.1f}" for a, b in zip(after[i], before[i], strict=True))
            for i in after
        }
        # Where the bucket lies in its episode: a link change inside it is marked.
        begin = (t0 - start) % seconds
        end = begin + (t1 - t0)
        note = " <- down" if begin <= down_at < end else " <- up" if begin <= up_at < end else ""
        print(
            f"{t0 - start:7.1f} {done:11d} {done * size / (t1 - t0) / 1e9:6.3f}   "
            f"{rates['eth0']} | {rates['eth1']}{note}"
        )
    print("rank 3's rails afterwards:", described[3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="1gbit", help="each NIC's tc rate (default 1gbit)")
    parser.add_argument("--size", default="16MiB", help="all-reduce size (default 16MiB)")
    parser.add_argument("--iters", type=int, default=10, help="timed all-reduces per steady run (default 10)")
    parser.add_argument("--seconds", type=float, default=12.0, help="the episode's length (default 12)")
    parser.add_argument("--down-at", type=float, default=3.0)
    parser.add_argument("--up-at", type=float, default=7.0)
    parser.add_argument("--episodes", type=int, default=1, help="down and up this many times (default 1)")
    args = parser.parse_args()
    available, reason = netns_available()
    if not available:
        raise SystemExit(f"network namespaces unavailable: {reason}")
    size = parse_size("--size", args.size)
    per_host = 2 * (LAYOUT.machines - 1) / LAYOUT.machines * size
    bound_s = per_host / (2 * parse_rate(args.rate))  # two NICs per host, each at the rate
    with NetnsCluster(LAYOUT.machines, rate=args.rate, networks=2) as cluster:
        medians = steady(cluster, size, args.iters)
        print(f"2x2, two {args.rate} NICs per host, {args.size} all-reduces, median of {args.iters}:")
        for failover, seconds in medians.items():
            print(
                f"  FAIRRING_RAIL_FAILOVER={int(failover)}: {seconds * 1e3:7.1f} ms, "
                f"{bound_s / seconds:.0%} of the two NICs' bound ({bound_s * 1e3:.1f} ms)"
            )
        print(f"  failover on / off: {medians[True] / medians[False]:.3f}x the time")
        episode(cluster, size, args.seconds, args.down_at, args.up_at, args.episodes)


if __name__ == "__main__":
    main()
