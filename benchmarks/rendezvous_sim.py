"""Simulates a group's rendezvous at scale against one real TCPStore, old protocol and new.

    python benchmarks/rendezvous_sim.py --ranks 1024 4096 --ranks-per-machine 8 [--interleaved]

Starts a TCPStore server (libuv) on 127.0.0.1 and drives thousands of
simulated ranks on one thread (or --threads, one store client each): a rank
runs until it must wait for keys, then parks until they exist while the
others go on. Machine ids are "machine-<m>" (FAIRRING_MACHINE_ID), LOCAL_RANK
is given; ranks are numbered machine by machine, or round-robin (--interleaved).

- new: fairring._rendezvous (a rank reads its machine's members and two rail
  keys of one short entry per machine);
- old: the exchange fairring used before (every rank reads every record), re-implemented for its store traffic: set
  this rank's record, wait for all N records, multi_get all N, then
  check_settings_agree and group_into_machines on them. Above --old-sample
  ranks, every rank sets its record but only a random sample reads them all
  (every rank's work is the same); the output says so.

Every rank's result is checked against group_into_machines on all identities.
Counting, per rank: each store call is one round trip (a wait for keys too;
TCPStore's get and multi_get also wait for their keys inside, not counted
apart); bytes sent are keys plus values, bytes received are values, integers
(add) count 8 bytes each way; no framing. Busy time is the time a rank spends
in its own steps (store calls and its own computing), not waiting for others.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# tests/test_rendezvous.py counts with the same CountingStore.

from benchmarks.counting_store import CountingStore
from fairring._config import MACHINE_ID, Config
from fairring._rendezvous import RankView, rendezvous_steps
from fairring._topology import RankIdentity, check_settings_agree, group_into_machines

OLD_PREFIX = "fairring/identity/"
# Simulated ranks' steps: they yield the keys they wait for and return their result.
Steps = Generator[list[str], None, Any]


@dataclass
class Rank:
    """One simulated rank: its steps, its counters, what it waits for, its result."""

    steps: Steps
    store: CountingStore
    busy: float = 0.0
    waiting: list[str] | None = None
    result: Any = None
    done: bool = False


@dataclass
class Run:
    protocol: str
    ranks: int
    machines: int
    measured: list[Rank]  # the ranks whose counters are reported (all, or the old protocol's sample)
    wall: float
    verified: int
    notes: list[str] = field(default_factory=list)


def identities(ranks: int, per_machine: int, interleaved: bool) -> list[RankIdentity]:
    machines = ranks // per_machine

    def machine_of(rank: int) -> int:
        return rank % machines if interleaved else rank // per_machine

    def local_of(rank: int) -> int:
        return rank // machines if interleaved else rank % per_machine

    return [
        RankIdentity(f"machine-{machine_of(r)}", MACHINE_ID, local_of(r), f"host-{machine_of(r)}") for r in range(ranks)
    ]


def views_of(layout: list[list[int]]) -> dict[int, RankView]:
    """Every rank's view of a whole layout: what _C.Topology(rank, layout) works out."""
    sizes = tuple(len(ranks) for ranks in layout)
    regular = len(set(sizes)) == 1
    views = {}
    for machine, local_ranks in enumerate(layout):
        for local_rank, rank in enumerate(local_ranks):
            views[rank] = RankView(
                rank=rank,
                world_size=sum(sizes),
                machine=machine,
                num_machines=len(layout),
                local_ranks=tuple(local_ranks),
                local_rank=local_rank,
                rail_peers=tuple(ranks[local_rank] for ranks in layout) if regular else (),
                regular=regular,
                machine_sizes=sizes,
            )
    return views


def old_steps(
    store: CountingStore, rank: int, size: int, identity: RankIdentity, settings: dict[str, int], reads: bool
) -> Steps:
    """The old exchange's store traffic; a rank with `reads` False stops after publishing its record."""
    store.set(f"{OLD_PREFIX}{rank}", json.dumps({"identity": asdict(identity), "settings": settings}))
    if not reads:
        return None
    keys = [f"{OLD_PREFIX}{r}" for r in range(size)]
    yield keys
    payloads = [json.loads(value) for value in store.multi_get(keys)]
    check_settings_agree([p["settings"] for p in payloads])
    return group_into_machines([RankIdentity(**p["identity"]) for p in payloads])


def drive(ranks: list[Rank], clients: list[dist.Store], seed: int, stall: float) -> float:
    """Runs every rank to its end on len(clients) threads; the wall time."""
    progress = [time.monotonic()]
    errors: list[BaseException] = []

    def step(rank: Rank) -> None:
        start = time.perf_counter()
        try:
            rank.waiting = next(rank.steps)
            rank.store.calls["wait"] += 1  # the real driver's store.wait
            rank.store.sent += sum(len(key) for key in rank.waiting)
        except StopIteration as stop:
            rank.result, rank.done, rank.waiting = stop.value, True, None
        rank.busy += time.perf_counter() - start
        progress[0] = time.monotonic()

    def worker(mine: list[Rank], poll: dist.Store) -> None:
        try:
            random.Random(seed).shuffle(mine)
            for rank in mine:
                step(rank)
            parked = [rank for rank in mine if not rank.done]
            while parked:
                present = {keys: poll.check(list(keys)) for keys in {tuple(r.waiting or ()) for r in parked}}
                ready = [rank for rank in parked if present[tuple(rank.waiting or ())]]
                for rank in ready:
                    step(rank)
                parked = [rank for rank in parked if not rank.done]
                if not ready:
                    if time.monotonic() - progress[0] > stall:
                        raise RuntimeError(f"no simulated rank progressed for {stall} s")
                    time.sleep(0.0005)  # the other threads' ranks must write what these wait for
        except BaseException as error:
            errors.append(error)

    threads = [
        threading.Thread(target=worker, args=(ranks[t :: len(clients)], client)) for t, client in enumerate(clients)
    ]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start


def simulate(protocol: str, size: int, per_machine: int, args: argparse.Namespace) -> Run:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=args.timeout, use_libuv=True)
    clients = [
        dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=args.timeout, use_libuv=True)
        for _ in range(args.threads)
    ]
    people = identities(size, per_machine, args.interleaved)
    settings = Config().must_agree()
    layout = group_into_machines(people)
    expected = views_of(layout)
    notes = []
    counting = [CountingStore(clients[r % len(clients)]) for r in range(size)]
    if protocol == "new":
        steps = [rendezvous_steps(counting[r], r, size, people[r], settings, args.timeout) for r in range(size)]
        sampled = set(range(size))
    else:
        sample = size if args.old_sample <= 0 else min(size, args.old_sample)
        sampled = set(random.Random(args.seed).sample(range(size), sample))
        if sample < size:
            notes.append(
                f"old at {size} ranks: all ranks publish their record, {sample} random ranks (seed {args.seed}) "
                "wait for and read all records; counts and busy time are theirs, totals are extrapolated x"
                f"{size / sample:.0f} (every rank does the same work)"
            )
        steps = [old_steps(counting[r], r, size, people[r], settings, r in sampled) for r in range(size)]
    ranks = [Rank(steps[r], counting[r]) for r in range(size)]
    wall = drive(ranks, clients, args.seed, args.timeout.total_seconds())
    measured = [ranks[r] for r in sorted(sampled)]
    if protocol == "new":
        verified = sum(ranks[r].result == expected[r] for r in range(size))
    else:
        verified = sum(ranks[r].result == layout for r in sampled)
    del clients, server
    return Run(protocol, size, len(layout), measured, wall, verified, notes)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def report(runs: list[Run]) -> None:
    header = (
        f"{'protocol':<8} {'ranks':>6} {'machines':>8} {'checked':>9} {'trips/rank':>11} "
        f"{'sent B/rank':>15} {'recv B/rank':>17} {'store MB':>9} {'wall s':>7} {'busy ms/rank':>13}"
    )
    print(header)
    print("-" * len(header))
    for run in runs:
        trips = [sum(rank.store.calls.values()) for rank in run.measured]
        sent = [rank.store.sent for rank in run.measured]
        received = [rank.store.received for rank in run.measured]
        scale = run.ranks / len(run.measured)
        total_mb = (sum(sent) + sum(received)) * scale / 1e6
        approx = "~" if scale > 1 else " "
        print(
            f"{run.protocol:<8} {run.ranks:>6} {run.machines:>8} {run.verified:>4}/{len(run.measured):<4} "
            f"{mean(trips):>5.1f} {max(trips):>3} max "
            f"{mean(sent):>9,.0f} {max(sent):>6,} {mean(received):>11,.0f} {max(received):>6,}"
            f"{approx}{total_mb:>8,.1f} {run.wall:>7.2f} {mean([r.busy for r in run.measured]) * 1000:>13.3f}"
        )
    print("\nstore calls per rank, by kind (mean, max):")
    for run in runs:
        kinds = sorted({kind for rank in run.measured for kind in rank.store.calls})
        counts = ", ".join(
            f"{kind} {mean(calls):.2f}/{max(calls)}"
            for kind in kinds
            for calls in [[rank.store.calls[kind] for rank in run.measured]]
        )
        print(f"  {run.protocol:<4} {run.ranks:>6} ranks: {counts}")
    notes = [note for run in runs for note in run.notes]
    print(
        "\nchecked: ranks whose result equals group_into_machines' (views for new, the layout for old)."
        "\nsent/recv B/rank: mean, then max; keys and values, integers as 8 bytes, no framing."
        "\nstore MB: all ranks' bytes through the store server (~: extrapolated from a sample)."
        "\nwall s: the whole simulation, as run (all ranks on --threads threads)."
        "\nbusy ms/rank: a rank's own store calls and computing, not its waiting for others."
    )
    for note in notes:
        print(f"note: {note}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024], help="group sizes to simulate")
    parser.add_argument("--ranks-per-machine", type=int, default=8, help="ranks on each machine (divides --ranks)")
    parser.add_argument("--interleaved", action="store_true", help="number ranks round-robin over machines")
    parser.add_argument("--protocols", nargs="+", choices=["new", "old"], default=["new", "old"])
    parser.add_argument(
        "--old-sample",
        type=int,
        default=1024,
        help="in the old protocol, only this many ranks (random) read all records; 0: every rank",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="driver threads, each with its own store client (more overlap the store's latency, but then a "
        "rank's busy time includes other threads holding the GIL)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the order ranks start in, and the old sample")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a stuck simulation fails")
    args = parser.parse_args(argv)
    args.timeout = timedelta(seconds=args.timeout)
    for size in args.ranks:
        if size % args.ranks_per_machine:
            parser.error(f"--ranks-per-machine {args.ranks_per_machine} does not divide --ranks {size}")
    runs: list[Run] = []
    for size in args.ranks:
        for protocol in args.protocols:
            run = simulate(protocol, size, args.ranks_per_machine, args)
            if run.verified != len(run.measured):
                raise SystemExit(
                    f"{protocol} at {size} ranks: {len(run.measured) - run.verified} ranks got a wrong view"
                )
            runs.append(run)
    report(runs)


if __name__ == "__main__":
    main()
