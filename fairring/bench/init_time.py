"""Init time: fairring against Gloo, from init_process_group to the first all-reduce, as the world grows.

Every rank is its own process on this host, on loopback, emulating M machines x
L ranks (FAIRRING_MACHINE_ID=machine-<m>, LOCAL_RANK=<l>). Each run starts
fresh processes for one backend; every rank imports torch and fairring, then
waits for a common start, so import time is excluded, and measures:

- init: `init_process_group` (the store client is connected before the start);
- first all-reduce: a 4 KiB float32 all-reduce, checked against plain torch
  arithmetic on every rank's input (for fairring this makes the engine: its
  local Gloo groups and the rails mesh);
- total: init + first all-reduce.

The ranks wait for each other between init and the all-reduce, so the
all-reduce also starts together and the store's keys can be counted after each
phase: the group's store is a TCPStore of its own in the parent (the benchmark's
control keys live in a second one), so its key count is the backends' own
traffic. Per world size, the table gives the median and the max over ranks of
each run, then the median over --repeats runs, and fairring/Gloo. Two rows in
parentheses explain the others: a second all-reduce right after the first (so
first - second is what the first one made), and how long after the start signal
ranks woke (CPU contention: many ranks share few cores here).

    python -m fairring.bench.init_time [--worlds 4 8 16] [--ranks-per-machine 4] [--repeats 3]

(from a checkout, `python benchmarks/init_time.py` runs it with the checkout's fairring;
tests/test_init_time.py is its smoke test).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

# Where the fairring package this module belongs to lies: the ranks run from there, so that they
# import the same fairring (a checkout's, or an installed one).
ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
BACKENDS = ("gloo", "fairring")
ELEMENTS = 1024  # 4 KiB of float32
# Per-rank timings reported, in the table's order.
TIMINGS = ("init_s", "all_reduce_s", "total_s")
LABELS = {"init_s": "init", "all_reduce_s": "first all-reduce", "total_s": "total"}
# Rows that explain the others: the next all-reduce (the first's cost less what it made), and how far
# after the parent's start signal a rank woke (CPU contention, not init).
DIAGNOSTICS = {"second_all_reduce_s": "second all-reduce", "start_lag_s": "start lag"}
POLL_S = 0.05
# How long ranks get to exit once told to, before they are killed.
EXIT_GRACE_S = 30.0


class BenchmarkError(RuntimeError):
    """A run failed: a rank crashed, timed out or computed a wrong all-reduce. No timing comes from it."""


@dataclass(frozen=True)
class Layout:
    machines: int
    ranks_per_machine: int

    @property
    def world_size(self) -> int:
        return self.machines * self.ranks_per_machine

    def __str__(self) -> str:
        return f"{self.machines}x{self.ranks_per_machine}"


@dataclass
class Run:
    """One run: fresh processes, one backend, one layout."""

    backend: str
    machines: int
    ranks_per_machine: int
    repeat: int
    # One dict per rank, by rank: TIMINGS, start_lag_s, correct.
    ranks: list[dict[str, float | bool]]
    keys_after_init: int
    keys_after_all_reduce: int

    @property
    def world_size(self) -> int:
        return self.machines * self.ranks_per_machine


@dataclass
class Row:
    """One line of a world's table: a measure's median over repeats, per backend, of its median and max over ranks."""

    measure: str
    median: dict[str, float] = field(default_factory=dict)
    max: dict[str, float] = field(default_factory=dict)


@dataclass
class Report:
    runs: list[Run]
    tables: dict[int, list[Row]]  # by world size


# --- one rank -----------------------------------------------------------------------------------


def die_with_parent(parent: int) -> None:
    """Nothing outlives the benchmark, even when the parent is killed outright."""
    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def rank_main(spec: dict[str, int | str | float]) -> int:
    die_with_parent(int(spec["parent"]))
    rank, world, backend = int(spec["rank"]), int(spec["world"]), str(spec["backend"])
    timeout = timedelta(seconds=float(spec["timeout_s"]))
    # Both backends' ranks have imported fairring (this module is part of it), so the processes are
    # alike but for the group they make.
    control = dist.TCPStore(HOST, int(spec["control_port"]), is_master=False, timeout=timeout)
    store = dist.TCPStore(HOST, int(spec["store_port"]), is_master=False, timeout=timeout)
    control.add("imported", 1)
    control.wait(["start"], timeout)
    start_lag = time.time() - float(control.get("start"))

    start = time.perf_counter()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    init_s = time.perf_counter() - start
    control.add("inited", 1)
    control.wait(["all_reduce"], timeout)

    tensor = torch.full((ELEMENTS,), float(rank + 1))
    start = time.perf_counter()
    dist.all_reduce(tensor)
    all_reduce_s = time.perf_counter() - start
    first = tensor
    # A second one, right after: what an all-reduce costs once everything is made.
    tensor = torch.full((ELEMENTS,), float(rank + 1))
    start = time.perf_counter()
    dist.all_reduce(tensor)
    second_s = time.perf_counter() - start
    expected = torch.stack([torch.full((ELEMENTS,), float(r + 1)) for r in range(world)]).sum(dim=0)
    correct = torch.equal(first, expected) and torch.equal(tensor, expected)

    result = {"init_s": init_s, "all_reduce_s": all_reduce_s, "total_s": init_s + all_reduce_s}
    result.update(second_all_reduce_s=second_s, start_lag_s=start_lag, correct=correct)
    control.set(f"result/{rank}", json.dumps(result))
    control.add("reduced", 1)
    # Stay in the group until every rank has its result: an early exit could fail a slower peer.
    control.wait(["exit"], timeout)
    dist.destroy_process_group()
    return 0 if correct else 3


# --- the parent ---------------------------------------------------------------------------------


def rank_env(layout: Layout, rank: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        FAIRRING_MACHINE_ID=f"machine-{rank // layout.ranks_per_machine}",
        LOCAL_RANK=str(rank % layout.ranks_per_machine),
        # Loopback only: the emulated machines share this host.
        TP_SOCKET_IFNAME="lo",
        GLOO_SOCKET_IFNAME="lo",
        # Dozens of ranks on a few cores: no intra-op thread pools fighting over them.
        OMP_NUM_THREADS="1",
    )
    return env


def log_tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:]) or "(no output)"


class Ranks:
    """The processes of one run; `close` kills whichever are left."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, spec: dict[str, int | str | float], env: dict[str, str]) -> None:
        rank = int(spec["rank"])
        with open(self.logs / f"rank{rank}.log", "wb") as log:
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "fairring.bench.init_time", "--rank-spec", json.dumps(spec)],
                    env=env,
                    cwd=ROOT,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    # Ctrl-C reaches the parent only, which then kills the ranks (no tracebacks from each).
                    start_new_session=True,
                )
            )

    def check_alive(self, phase: str) -> None:
        for rank, process in enumerate(self.processes):
            if process.poll() is not None:
                raise BenchmarkError(
                    f"rank {rank} exited with status {process.returncode} during {phase}:\n"
                    f"{log_tail(self.logs / f'rank{rank}.log')}"
                )

    def wait_exit(self, deadline: float) -> None:
        for rank, process in enumerate(self.processes):
            try:
                status = process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise BenchmarkError(f"rank {rank} did not exit within {EXIT_GRACE_S:.0f} s") from None
            if status != 0:
                raise BenchmarkError(
                    f"rank {rank} exited with status {status}:\n{log_tail(self.logs / f'rank{rank}.log')}"
                )

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)


def wait_count(control: dist.TCPStore, key: str, count: int, ranks: Ranks, timeout_s: float) -> None:
    """Until `count` ranks have added 1 to `key`; fails at once if a rank dies, else after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while control.add(key, 0) < count:
        ranks.check_alive(f"the wait for {key!r}")
        if time.monotonic() > deadline:
            raise BenchmarkError(
                f"only {control.add(key, 0)} of {count} ranks reached {key!r} within {timeout_s:.0f} s"
            )
        time.sleep(POLL_S)


def run_once(backend: str, layout: Layout, repeat: int, timeout_s: float) -> Run:
    world = layout.world_size
    timeout = timedelta(seconds=timeout_s)

    def host_store() -> dist.TCPStore:
        return dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False, timeout=timeout)

    # Two stores: the group's, whose keys are the backends' own, and the benchmark's control keys.
    store, control = host_store(), host_store()
    baseline_keys = store.num_keys()
    with tempfile.TemporaryDirectory(prefix="init_time-") as logs:
        ranks = Ranks(Path(logs))
        try:
            for rank in range(world):
                spec = {"rank": rank, "world": world, "backend": backend, "timeout_s": timeout_s}
                spec.update(control_port=control.port, store_port=store.port, parent=os.getpid())
                ranks.start(spec, rank_env(layout, rank))
            wait_count(control, "imported", world, ranks, timeout_s)
            control.set("start", repr(time.time()))
            wait_count(control, "inited", world, ranks, timeout_s)
            keys_after_init = store.num_keys() - baseline_keys
            control.set("all_reduce", "")
            wait_count(control, "reduced", world, ranks, timeout_s)
            keys_after_all_reduce = store.num_keys() - baseline_keys
            results = [json.loads(control.get(f"result/{rank}")) for rank in range(world)]
            wrong = [rank for rank, result in enumerate(results) if result["correct"] is not True]
            if wrong:
                raise BenchmarkError(f"{backend} on {layout}: the all-reduce on ranks {wrong} gave a wrong sum")
            control.set("exit", "")
            ranks.wait_exit(time.monotonic() + EXIT_GRACE_S)
        finally:
            ranks.close()
    return Run(
        backend,
        layout.machines,
        layout.ranks_per_machine,
        repeat,
        results,
        keys_after_init,
        keys_after_all_reduce,
    )


def summarize(runs: Sequence[Run]) -> list[Row]:
    """The rows of one world's table (runs of one layout, both backends)."""
    rows = []
    for measure in (*TIMINGS, *DIAGNOSTICS):
        row = Row(measure)
        for backend in BACKENDS:
            mine = [run for run in runs if run.backend == backend]
            per_run = [[float(rank[measure]) for rank in run.ranks] for run in mine]
            row.median[backend] = statistics.median(statistics.median(values) for values in per_run)
            row.max[backend] = statistics.median(max(values) for values in per_run)
        rows.append(row)
    for measure in ("keys_after_init", "keys_after_all_reduce"):
        row = Row(measure)
        for backend in BACKENDS:
            # The same on every rank: one number per run.
            value = statistics.median(getattr(run, measure) for run in runs if run.backend == backend)
            row.median[backend] = row.max[backend] = value
        rows.append(row)
    return rows


def ratio(fairring: float, gloo: float) -> str:
    return f"{fairring / gloo:.2f}x" if gloo > 0 else "-"


def format_table(layout: Layout, repeats: int, rows: Sequence[Row]) -> str:
    head = f"world {layout.world_size} = {layout.machines} machines x {layout.ranks_per_machine} ranks"
    load = os.getloadavg()[0]
    lines = [f"{head}; median over {repeats} run(s) of each run's median and max over ranks (load now {load:.1f})"]
    if layout.machines == 1:
        lines.append("  (one machine: fairring's all-reduce takes the flat path, no engine is made)")
    columns = ("gloo med", "gloo max", "fairring med", "fairring max", "ratio med", "ratio max")
    lines.append(f"  {'':28}" + "".join(f"{c:>13}" for c in columns))
    for row in rows:
        if row.measure.endswith("_s"):
            cells = [f"{row.median['gloo'] * 1e3:10.1f} ms", f"{row.max['gloo'] * 1e3:10.1f} ms"]
            cells += [f"{row.median['fairring'] * 1e3:10.1f} ms", f"{row.max['fairring'] * 1e3:10.1f} ms"]
            cells += [ratio(row.median["fairring"], row.median["gloo"]), ratio(row.max["fairring"], row.max["gloo"])]
            if row.measure == "start_lag_s":  # not a cost of either backend
                cells[4:] = ["", ""]
            label = LABELS.get(row.measure) or f"({DIAGNOSTICS[row.measure]})"
        else:
            cells = [f"{row.median['gloo']:.0f}", "", f"{row.median['fairring']:.0f}", ""]
            cells += [ratio(row.median["fairring"], row.median["gloo"]), ""]
            label = "store keys after " + ("init" if row.measure == "keys_after_init" else "all-reduce")
        lines.append(f"  {label:28}" + "".join(f"{cell:>13}" for cell in cells))
    return "\n".join(lines)


def describe_run(run: Run) -> str:
    def stats(measure: str) -> str:
        values = [float(rank[measure]) * 1e3 for rank in run.ranks]
        return f"{LABELS[measure]} {statistics.median(values):.0f}/{max(values):.0f}"

    timings = ", ".join(stats(measure) for measure in TIMINGS)
    return (
        f"  {run.machines}x{run.ranks_per_machine} run {run.repeat + 1} {run.backend:8} ms (median/max): {timings}; "
        f"store keys after init/all-reduce {run.keys_after_init}/{run.keys_after_all_reduce}"
    )


def machine_facts() -> str:
    cores = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}, "
        f"{cores} cores ({usable} usable), load average {load}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, nargs="+", default=[4, 8, 16], help="world sizes (default: 4 8 16)")
    parser.add_argument(
        "--ranks-per-machine", type=int, default=4, help="L; a world of N ranks is N/L machines (default: 4)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per world and backend, fresh processes each")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds any one wait may take (default: 180)")
    parser.add_argument("--json", type=Path, help="also write every run's per-rank numbers here")
    # A rank of a run: the parent starts this file again with its spec.
    parser.add_argument("--rank-spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_spec is None:
        for world in args.worlds:
            if world < 2 or world % args.ranks_per_machine:
                parser.error(f"world {world} is not a multiple of --ranks-per-machine {args.ranks_per_machine}")
        if args.repeats < 1:
            parser.error("--repeats must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> Report:
    args = parse_args(argv)
    command = shlex.join([sys.executable, *(sys.argv if argv is None else [__file__, *argv])])
    print(f"command: {command}")
    print(machine_facts(), flush=True)
    runs: list[Run] = []
    tables: dict[int, list[Row]] = {}
    for world in args.worlds:
        layout = Layout(world // args.ranks_per_machine, args.ranks_per_machine)
        mine = []
        for repeat in range(args.repeats):
            # Alternate which backend goes first, so neither always meets a colder machine.
            for backend in BACKENDS if repeat % 2 == 0 else BACKENDS[::-1]:
                run = run_once(backend, layout, repeat, args.timeout)
                print(describe_run(run), flush=True)
                mine.append(run)
        tables[world] = summarize(mine)
        print(format_table(layout, args.repeats, tables[world]), flush=True)
        runs += mine
    if args.json is not None:
        record = {"command": command, "machine": machine_facts(), "runs": [asdict(run) for run in runs]}
        args.json.write_text(json.dumps(record, indent=1))
    return Report(runs, tables)


def entry() -> int:
    if "--rank-spec" in sys.argv:
        return rank_main(json.loads(parse_args(sys.argv[1:]).rank_spec))

    def interrupted(signum: int, _frame: object) -> None:
        # SIGTERM unwinds like Ctrl-C, so the runs' `finally` kills their ranks.
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    # Also when started where SIGINT is ignored (a shell's background job), so that it still ends a run.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        main()
    except BenchmarkError as error:
        print(f"init_time: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("init_time: interrupted; every rank was killed", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(entry())
