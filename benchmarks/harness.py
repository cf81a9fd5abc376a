"""Real multi-process test harness: a pool of ranks, each a process, that run test code.

A RankPool starts one process per rank, each with the environment of its
emulated machine, and initialises a real process group in each (over a real
TCPStore, or env://, tcp://, file://). Tests then send module-level functions to
run on every rank and get their return values back. Importing torch dominates a
rank's start (seconds of CPU), so ranks are forked from multiprocessing's fork
server, which has imported it once; a rank whose environment must be read as
torch loads is spawned instead. One pool serves many tests.

Every call has a deadline. A rank that fails, or does not answer in time, ends
the call with an error that shows each rank's traceback; if ranks are left
hanging (a peer died mid-collective), the pool is killed and starts afresh on
its next use. Workers die with their parent (PR_SET_PDEATHSIG): the test
process, or the fork server, which exits with it; so nothing outlives a run,
even one that is killed.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch.distributed as dist

    from fairring.bench.netns import Host

COLLECTIVE_TIMEOUT = timedelta(seconds=60)
CALL_TIMEOUT = 120.0
# How long the other ranks get to report once one rank has failed.
FAILURE_GRACE = 10.0
# Tests use small tensors, which must reach the Herring path whatever the default
# flat threshold is (the test of the threshold sets its own).
ENGINE_AT_EVERY_SIZE = {"FAIRRING_FLAT_THRESHOLD": "0"}


@dataclass(frozen=True)
class Layout:
    """`machines` x `ranks_per_machine` ranks; interleaved: rank r on machine r % machines."""

    machines: int
    ranks_per_machine: int
    interleaved: bool = False

    @property
    def world_size(self) -> int:
        return self.machines * self.ranks_per_machine

    def machine_of(self, rank: int) -> int:
        return rank % self.machines if self.interleaved else rank // self.ranks_per_machine

    def ranks_of(self, machine: int) -> list[int]:
        return [r for r in range(self.world_size) if self.machine_of(r) == machine]

    def env_of(self, rank: int) -> dict[str, str]:
        # Emulated machines share this host: keep the rails on loopback.
        return {"FAIRRING_MACHINE_ID": f"machine-{self.machine_of(rank)}", "TP_SOCKET_IFNAME": "lo"}

    def __str__(self) -> str:
        return f"{self.machines}x{self.ranks_per_machine}" + ("-interleaved" if self.interleaved else "")


class RankFailure(AssertionError):
    """Some rank raised, or did not answer in time; holds each rank's outcome."""

    def __init__(self, what: str, outcomes: dict[int, str], results: dict[int, Any] | None = None) -> None:
        self.outcomes = outcomes
        # What the ranks that did not fail returned.
        self.results = results or {}
        details = "\n".join(f"--- rank {rank} ---\n{outcome}" for rank, outcome in sorted(outcomes.items()))
        super().__init__(f"{what}\n{details}")


@dataclass
class InitSpec:
    """How ranks rendezvous: "store" (a TCPStore the test process hosts), "env", "tcp", "file"."""

    method: str = "store"
    backend: str = "fairring"
    host: str = "127.0.0.1"
    port: int = 0
    path: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    # The process group's timeout: how long a collective may wait.
    timeout: timedelta = COLLECTIVE_TIMEOUT


def _die_with_parent() -> None:
    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _worker(
    rank: int, world_size: int, env: dict[str, str], conn: Connection, namespace: str | None, forked: bool
) -> None:
    _die_with_parent()
    if forked:
        # The fork server ignores a preload it could not import; a cold rank would still pass, only slower.
        assert all(name in sys.modules for name in FORK_SERVER_PRELOAD), "the fork server preloaded nothing"
        for stream in (1, 2):
            received = reduction.recv_handle(conn)
            os.dup2(received, stream)
            os.close(received)
        from benchmarks.rank_preload import SET_BY_PRELOAD

        # The pool forks only where the fork server's environment (less what its imports set) agrees on what
        # torch read as it loaded.
        inherited = {name: value for name, value in os.environ.items() if name not in SET_BY_PRELOAD}
        differing = differences_read_at_import(env, inherited)
        assert not differing, f"rank {rank} was forked from a fork server whose environment differs in {differing}"
        for name, apply in APPLIED_BY_THE_RANK.items():
            if name in env and name not in os.environ:
                apply(env[name])
        env = {**SET_BY_PRELOAD, **env}
    if namespace is not None:
        # First, while this process has one thread and no sockets.
        from fairring.bench.netns import enter_namespace

        enter_namespace(namespace)
    os.environ.clear()
    os.environ.update(env)
    while True:
        message = conn.recv()
        if message is None:
            break
        function, args = message
        try:
            conn.send(("ok", function(*args)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        conn.close()


def init_process_group(spec: InitSpec, rank: int, world_size: int, store_port: int) -> str:
    """Runs on each rank: joins the process group as `spec` says."""
    import torch.distributed as dist

    import fairring  # noqa: F401  (registers the backend)

    common = {"backend": spec.backend, "timeout": spec.timeout}
    if spec.method == "store":
        store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=COLLECTIVE_TIMEOUT)
        dist.init_process_group(store=store, rank=rank, world_size=world_size, **common)
    elif spec.method == "env":
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec.port), RANK=str(rank), WORLD_SIZE=str(world_size)
        )
        dist.init_process_group(init_method="env://", **common)
    elif spec.method == "tcp":
        dist.init_process_group(
            init_method=f"tcp://{spec.host}:{spec.port}", rank=rank, world_size=world_size, **common
        )
    elif spec.method == "file":
        dist.init_process_group(init_method=f"file://{spec.path}", rank=rank, world_size=world_size, **common)
    else:
        raise ValueError(f"unknown init method {spec.method!r}")
    return dist.get_backend()


def make_flat_group(threshold: str) -> dist.ProcessGroup:
    """Runs on each rank: a fairring group over every rank whose all-reduces below `threshold` take the
    delegate (each group reads FAIRRING_FLAT_THRESHOLD when it is made)."""
    import torch.distributed as dist

    previous = os.environ.get("FAIRRING_FLAT_THRESHOLD")
    os.environ["FAIRRING_FLAT_THRESHOLD"] = threshold
    try:
        return dist.new_group(backend="fairring")
    finally:
        if previous is None:
            del os.environ["FAIRRING_FLAT_THRESHOLD"]
        else:
            os.environ["FAIRRING_FLAT_THRESHOLD"] = previous


def wait_for_emulated_callers_stream() -> None:
    """Runs on a rank: where the emulated device holds the caller's stream (`caller_stream`: wait() made
    that stream wait for the op, not the host), returns once the stream is done, as a reader of the result
    on a GPU would synchronize; elsewhere returns at once."""
    if "caller_stream" not in os.environ.get("FAIRRING_TEST_EMULATED_DEVICE", ""):
        return
    from fairring import _C

    assert _C._testing.caller_stream_synchronize(timeout=timedelta(seconds=60)), "the caller's stream stayed held"


# What the fork server imports, once (benchmarks/rank_preload.py): torch and its lazy imports take seconds of
# CPU, a fork milliseconds.
FORK_SERVER_PRELOAD = ["benchmarks.rank_preload"]
# Variables nothing in FORK_SERVER_PRELOAD reads as it loads (fairring reads its own at its import, in the rank,
# and the rest when a group, store or engine is made): a rank whose environment differs from the fork server's
# only in these is forked from it; any other difference (OMP_NUM_THREADS, TORCH_DISTRIBUTED_DEBUG, ...) is read
# as libgomp or torch.distributed loads, so that rank is spawned, and imports torch with its own environment.
READ_AFTER_IMPORT = ("FAIRRING_", "TP_", "GLOO_", "NIXL_", "UCX_", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
# Nothing that loads reads these: the test pytest is running, and the terminal's size (which readline sets in
# the C environment only, so os.environ lacks it).
READ_BY_NOTHING_LOADED = ("PYTEST_CURRENT_TEST", "COLUMNS", "LINES")


def _set_malloc_arena_max(value: str) -> None:
    m_arena_max = -8  # glibc's malloc.h; the variable and mallopt set the same limit
    ctypes.CDLL("libc.so.6").mallopt(m_arena_max, int(value))


# Read as a process starts, but applied by a forked rank itself where the fork server left the default (it
# runs one thread, so it has made no arena beyond the main one).
APPLIED_BY_THE_RANK = {"MALLOC_ARENA_MAX": _set_malloc_arena_max}


def read_after_import(name: str) -> bool:
    return name.startswith(READ_AFTER_IMPORT) or name in READ_BY_NOTHING_LOADED


def differences_read_at_import(env: dict[str, str], server_env: dict[str, str]) -> list[str]:
    """The variables, other than those read after import, that `env` sets differently from `server_env`."""
    return sorted(
        name
        for name in env.keys() | server_env.keys()
        if env.get(name) != server_env.get(name)
        and not read_after_import(name)
        and not (name in APPLIED_BY_THE_RANK and name not in server_env)
    )


class _ForkServer:
    """multiprocessing's fork server with torch imported, and the environment it was started with."""

    env: dict[str, str] | None = None

    @classmethod
    def start(cls) -> None:
        """Starts the server, with this process's environment as it is now, unless it runs already."""
        if cls.env is None:
            from multiprocessing import forkserver

            mp.get_context("forkserver").set_forkserver_preload(FORK_SERVER_PRELOAD)
            forkserver.ensure_running()
            cls.env = dict(os.environ)

    @classmethod
    def context_for(cls, envs: Sequence[dict[str, str]]) -> Any:
        """The fork server's context if every rank's `envs` can be forked from it, else spawn's."""
        cls.start()
        assert cls.env is not None
        if any(differences_read_at_import(env, cls.env) for env in envs):
            return mp.get_context("spawn")
        return mp.get_context("forkserver")


def start_fork_server() -> None:
    """Starts the server ranks are forked from, with this environment; the first pool starts it otherwise, with
    its test's (a test's monkeypatched OMP_NUM_THREADS would then make every later rank differ, and spawn)."""
    _ForkServer.start()


class RankPool:
    """Ranks of `layout`; with `hosts` (one per machine), each machine's ranks run
    inside that host's network namespace and rank 0 serves the store."""

    def __init__(
        self,
        layout: Layout,
        spec: InitSpec | None = None,
        rank_env: dict[int, dict[str, str]] | None = None,
        hosts: Sequence[Host] | None = None,
    ):
        self.layout = layout
        self.hosts = list(hosts) if hosts is not None else None
        if self.hosts is not None:
            assert len(self.hosts) == layout.machines, "one host per machine"
            spec = spec or InitSpec(method="tcp", host=self.hosts[layout.machine_of(0)].address, port=29500)
        self.spec = spec or InitSpec()
        self.rank_env = rank_env or {}
        self._processes: list[mp.process.BaseProcess] = []
        self._conns: list[Connection] = []
        self._store: Any = None

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def start(self, init: bool = True) -> RankPool:
        """Spawns the ranks and (by default) joins them into a process group."""
        import torch.distributed as dist

        store_port = 0
        if self.spec.method == "store":
            self._store = dist.TCPStore(
                "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=COLLECTIVE_TIMEOUT
            )
            store_port = self._store.port
        # Each rank's whole environment, as a spawned process inherits it: a forked one has the fork server's.
        envs = [
            {
                **os.environ,
                **ENGINE_AT_EVERY_SIZE,
                **self._placement_env(rank),
                **self.spec.extra_env,
                **self.rank_env.get(rank, {}),
            }
            for rank in range(self.world_size)
        ]
        context = _ForkServer.context_for(envs)
        forked = context.get_start_method() == "forkserver"
        for rank, env in enumerate(envs):
            namespace = self.hosts[self.layout.machine_of(rank)].name if self.hosts else None
            parent, child = context.Pipe()
            process = context.Process(
                target=_worker,
                args=(rank, self.world_size, env, child, namespace, forked),
                daemon=True,
                name=f"rank{rank}",
            )
            process.start()
            child.close()
            if forked:
                # The test's stdout and stderr as they are now (pytest's capture of this test), where a spawned
                # rank would inherit them: a forked one has the fork server's.
                for stream in (1, 2):
                    reduction.send_handle(parent, stream, process.pid)
            self._processes.append(process)
            self._conns.append(parent)
        self._store_port = store_port
        if init:
            self.init()
        return self

    def _placement_env(self, rank: int) -> dict[str, str]:
        if self.hosts is None:
            return self.layout.env_of(rank)
        # Separate hosts: machines are discovered (each namespace is one), and
        # every network path goes through the host's NIC.
        return {"TP_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}

    def init_args(self, rank: int) -> tuple[InitSpec, int, int, int]:
        """The arguments of init_process_group for `rank`."""
        return (self.spec, rank, self.world_size, self._store_port)

    def init(self) -> list[str]:
        return self.run_per_rank(init_process_group, self.init_args)

    def run(self, function: Callable[..., Any], *args: Any, timeout: float = CALL_TIMEOUT) -> list[Any]:
        """Runs function(*args) on every rank; returns the results by rank."""
        return self.run_per_rank(function, lambda rank: args, timeout=timeout)

    def run_per_rank(
        self,
        function: Callable[..., Any],
        args_of: Callable[[int], tuple[Any, ...]],
        timeout: float = CALL_TIMEOUT,
    ) -> list[Any]:
        if not self._processes:
            self.start()
        for rank, conn in enumerate(self._conns):
            conn.send((function, args_of(rank)))
        name = getattr(function, "__name__", str(function))
        deadline = time.monotonic() + timeout
        results: dict[int, Any] = {}
        failures: dict[int, str] = {}
        pending = set(range(self.world_size))
        while pending:
            now = time.monotonic()
            if now >= deadline:
                break
            for rank in sorted(pending):
                conn = self._conns[rank]
                if conn.poll(min(0.05, max(0.0, deadline - now))):
                    try:
                        status, value = conn.recv()
                    except EOFError:
                        status, value = "error", f"rank {rank} exited (exit code {self._processes[rank].exitcode})"
                    pending.discard(rank)
                    if status == "ok":
                        results[rank] = value
                    else:
                        failures[rank] = value
                        deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
                elif not self._processes[rank].is_alive():
                    pending.discard(rank)
                    failures[rank] = f"rank {rank} died (exit code {self._processes[rank].exitcode})"
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
        if pending:
            for rank in pending:
                failures[rank] = "no answer before the deadline (killed)"
            self.close()
        if failures:
            raise RankFailure(f"{name} failed on ranks {sorted(failures)} of {self.world_size}", failures, results)
        return [results[rank] for rank in range(self.world_size)]

    def close(self) -> None:
        """Stops every rank: politely if idle, by SIGKILL otherwise."""
        for conn, process in zip(self._conns, self._processes, strict=True):
            if process.is_alive():
                try:
                    conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
        for conn in self._conns:
            conn.close()
        self._processes, self._conns = [], []
        self._store = None

    def __enter__(self) -> RankPool:
        return self if self._processes else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
