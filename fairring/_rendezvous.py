"""A group's rendezvous that scales: each rank learns its own view, not the world.

The obvious exchange, which fairring used before, has every rank read every
rank's record: N reads per rank, N² through one store server. Here a rank reads only what its view
(`RankView`) needs: its machine's ranks, and per machine its lowest rank, its
size and this rank's rail peer there, in a fixed number of store round trips
whatever the size. No rank, not even one coordinator, reads all N records.

Protocol (keys under PREFIX/<size>/<generation>/; a round's keys under
"id/", or "host/" in the rare second round):

0. Generation: `add(joined, 1)`. Every later key is under its generation, so
   the same store can host the same group's rendezvous again (after
   destroy_process_group): a rendezvous ends only once all `size` ranks have
   joined, so the joins of two never mix.
1. Agreement: `compare_set(agreed, "", mine)`: the first rank's settings and
   identity source win. A rank that differs appends itself to `dissent`
   before it arrives (step 2), so `dissent` is complete once all arrived.
2. Registration: append "rank,LOCAL_RANK" to the members of this rank's
   machine (keyed by a digest of its id), and "rank,machine" to the roster
   (read only to name missing ranks); then `add(arrived, 1)`. The last to
   arrive sets `done`, saying whether settings conflict (every rank then
   raises ConfigError) or identity sources mix (every rank then registers
   again, by host, as group_into_machines groups them).
3. After `done`: one multi_get of `done` and the machine's members gives the
   local order, this rank's local index i, the machine's lowest rank and
   size. Append "lowest,size,rank" to `rail/i`, then `add(published, 1)`;
   the last to publish sets `ready`.
4. After `ready`: one multi_get of `rail/0` and `rail/i`. `rail/0` holds one
   entry per machine (each has a local rank 0): ordered by lowest rank, they
   give the machines' order and sizes. If every machine has the same size,
   `rail/i` holds one entry per machine too: this rank's rail peers.

Round trips per rank: 11 (add, compare_set, append, append, add, wait,
multi_get, append, add, wait, multi_get), whatever the size; +2 for the last
to arrive (check, set; +1 multi_get if a rank dissents), +1 for the last to
publish (set). No call names more than two keys. A rank reads L members and
2M rail entries of about 12 bytes (L ranks on its machine, M machines); the
store serves O(N·(L+M)) bytes in all, against O(N²) before. Only failure
paths (a rank missing, settings that conflict, mixed sources) read O(N).

`rendezvous_steps` is the protocol as a generator: it does its store
operations itself and yields the keys it must wait for, so a simulator can
drive thousands of ranks on a few threads. `rendezvous` drives it with
`store.wait`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from ._config import ConfigError
from ._topology import RankIdentity, TopologyError, warn_mixed_sources

PREFIX = "fairring/rendezvous/"
# 80 bits of sha256: machine ids are arbitrary strings, keys should be short.
_DIGEST_CHARS = 20
# Errors list this many ranks and count the rest.
_SHOWN = 16
# A zero timeout means "forever" to c10d stores; never pass one.
_MIN_WAIT = timedelta(milliseconds=1)
_BY_ID = "id"
_BY_HOST = "host"

logger = logging.getLogger("fairring")

# (rank, LOCAL_RANK or None) of one rank on a machine.
Member = tuple[int, int | None]


class RendezvousStore(Protocol):
    """The c10d Store methods the rendezvous uses (torch's Store has them all)."""

    def add(self, key: str, value: int, /) -> int: ...
    def append(self, key: str, value: str, /) -> None: ...
    def check(self, keys: list[str], /) -> bool: ...
    def compare_set(self, key: str, expected: str, desired: str, /) -> bytes: ...
    def get(self, key: str, /) -> bytes: ...
    def multi_get(self, keys: list[str], /) -> list[bytes]: ...
    def set(self, key: str, value: str, /) -> None: ...
    def wait(self, keys: list[str], timeout: timedelta, /) -> None: ...


@dataclass(frozen=True)
class RankView:
    """What one rank knows of its group's layout (`_C.Topology`'s view constructor takes it)."""

    rank: int
    world_size: int
    # This rank's machine, as an index into machine_sizes (machines ordered by lowest rank).
    machine: int
    num_machines: int
    # The group ranks on this rank's machine, in local order; local_rank indexes it.
    local_ranks: tuple[int, ...]
    local_rank: int
    # By machine, the rank with this rank's local index there; empty unless regular.
    rail_peers: tuple[int, ...]
    # Every machine holds the same number of ranks.
    regular: bool
    machine_sizes: tuple[int, ...]


class WaitTimedOut(Exception):
    """Thrown into `rendezvous_steps` by its driver when the keys it yielded did not appear in time."""


# Yields lists of keys that must exist before the rank goes on; returns the view.
Steps = Generator[list[str], None, RankView]
# A round's outcome for one rank: the `done` record and its machine's members.
_Registered = Generator[list[str], None, tuple[dict[str, Any], list[Member]]]


def rendezvous(
    store: RendezvousStore,
    rank: int,
    size: int,
    identity: RankIdentity,
    settings: Mapping[str, int | str],
    timeout: timedelta,
) -> RankView:
    """This rank's view of the group; ConfigError if settings differ, TopologyError if a rank is missing."""
    deadline = time.monotonic() + timeout.total_seconds()
    steps = rendezvous_steps(store, rank, size, identity, settings, timeout)
    try:
        keys = next(steps)
        while True:
            try:
                store.wait(keys, max(timedelta(seconds=deadline - time.monotonic()), _MIN_WAIT))
            except Exception as error:  # c10d raises DistStoreError, or whatever a broken connection gives
                timed_out = WaitTimedOut(f"waiting for {keys}")
                timed_out.__cause__ = error
                keys = steps.throw(timed_out)
            else:
                keys = steps.send(None)
    except StopIteration as stop:
        view: RankView = stop.value
        return view


def rendezvous_steps(
    store: RendezvousStore,
    rank: int,
    size: int,
    identity: RankIdentity,
    settings: Mapping[str, int | str],
    timeout: timedelta,
) -> Steps:
    """The protocol for one rank (see the module's docstring); `timeout` only words the error."""
    if not 0 <= rank < size:
        raise ValueError(f"fairring: rank {rank} is not in a group of {size}")
    return _Rendezvous(store, rank, size, identity, dict(settings), timeout).steps()


class _Rendezvous:
    def __init__(
        self,
        store: RendezvousStore,
        rank: int,
        size: int,
        identity: RankIdentity,
        settings: dict[str, int | str],
        timeout: timedelta,
    ) -> None:
        self.store = store
        self.rank = rank
        self.size = size
        self.identity = identity
        self.settings = settings
        self.timeout = timeout
        # The generation's and the round's key prefixes, set as the protocol goes.
        self.base = ""
        self.round = ""

    def steps(self) -> Steps:
        joined = self.store.add(f"{PREFIX}{self.size}/joined", 1)
        self.base = f"{PREFIX}{self.size}/{(joined - 1) // self.size}/"
        self._agree()
        done, members = yield from self._register(_BY_ID, self.identity.machine_id)
        if done.get("conflict"):
            raise ConfigError(done["conflict"])
        if done.get("mixed"):
            if self.rank == 0:
                self._warn_mixed()
            done, members = yield from self._register(_BY_HOST, self.identity.host)
        return (yield from self._assemble(members))

    def _agree(self) -> None:
        mine = {"rank": self.rank, "source": self.identity.source, "settings": self.settings}
        winner = json.loads(self.store.compare_set(f"{self.base}agreed", "", json.dumps(mine)))
        if (winner["source"], winner["settings"]) != (mine["source"], mine["settings"]):
            self.store.append(f"{self.base}dissent", json.dumps(mine) + "\n")

    def _register(self, by: str, machine_id: str) -> _Registered:
        self.round = f"{self.base}{by}/"
        digest = hashlib.sha256(machine_id.encode()).hexdigest()[:_DIGEST_CHARS]
        local = "" if self.identity.local_rank is None else str(self.identity.local_rank)
        self.store.append(f"{self.round}machine/{digest}", f"{self.rank},{local};")
        # After the members: a rank on the roster is on its machine's members (the failure paths rely on it).
        self.store.append(f"{self.round}roster", f"{self.rank},{digest};")
        if self.store.add(f"{self.round}arrived", 1) == self.size:
            self._close(by)
        yield from self._wait([f"{self.round}done"], self._unregistered)
        done, members = self.store.multi_get([f"{self.round}done", f"{self.round}machine/{digest}"])
        return json.loads(done), _members(members)

    def _close(self, by: str) -> None:
        """The last rank to arrive says whether settings conflict and sources mix, for all."""
        record: dict[str, Any] = {}
        if by == _BY_ID and self.store.check([f"{self.base}dissent"]):
            winner, dissenters = self._agreement()
            record["conflict"] = _settings_conflict(winner, dissenters, self.size)
            record["mixed"] = any(d["source"] != winner["source"] for d in dissenters)
        self.store.set(f"{self.round}done", json.dumps(record))

    def _agreement(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        agreed, dissent = self.store.multi_get([f"{self.base}agreed", f"{self.base}dissent"])
        return json.loads(agreed), [json.loads(line) for line in dissent.decode().splitlines()]

    def _warn_mixed(self) -> None:
        """Today's warning, with every rank by source: O(N), only on this misconfiguration."""
        winner, dissenters = self._agreement()
        source_of = dict.fromkeys(range(self.size), winner["source"])
        source_of.update((d["rank"], d["source"]) for d in dissenters)
        by_source: dict[str, list[int]] = {}
        for rank, source in source_of.items():
            by_source.setdefault(source, []).append(rank)
        warn_mixed_sources(by_source)

    def _assemble(self, members: list[Member]) -> Steps:
        members.sort(key=_local_order)
        local_ranks = tuple(rank for rank, _ in members)
        local_rank = local_ranks.index(self.rank)
        lowest = min(local_ranks)
        local = [local for _, local in members]
        if local_rank == 0 and None not in local and len(set(local)) != len(local):
            # As group_into_machines: the order stays deterministic, only the rails' pairing may be odd.
            logger.debug("machine of rank %d: ranks %s report repeated LOCAL_RANK %s", lowest, local_ranks, local)
        # rail/0 doubles as the machine list: every machine has a local rank 0.
        rails = [f"{self.round}rail/{index}" for index in sorted({0, local_rank})]
        self.store.append(rails[-1], f"{lowest},{len(local_ranks)},{self.rank};")
        if self.store.add(f"{self.round}published", 1) == self.size:
            self.store.set(f"{self.round}ready", "1")
        yield from self._wait([f"{self.round}ready"], self._unpublished)
        values = self.store.multi_get(rails)
        # (lowest rank, size, rank) by machine; machines are ordered by their lowest rank.
        machines = sorted(_rail(values[0]))
        machine_sizes = tuple(size for _, size, _ in machines)
        regular = len(set(machine_sizes)) == 1
        if not regular and self.rank == 0:
            logger.debug("irregular layout (machine sizes %s): all-reduces take the flat path", machine_sizes)
        return RankView(
            rank=self.rank,
            world_size=self.size,
            machine=[first for first, _, _ in machines].index(lowest),
            num_machines=len(machines),
            local_ranks=local_ranks,
            local_rank=local_rank,
            # Regular: rail/i has an entry on every machine.
            rail_peers=tuple(rank for _, _, rank in sorted(_rail(values[-1]))) if regular else (),
            regular=regular,
            machine_sizes=machine_sizes,
        )

    def _wait(self, keys: list[str], missing: Callable[[], list[int]]) -> Generator[list[str], None, None]:
        try:
            yield keys
        except WaitTimedOut as timed_out:
            absent = missing()
            raise TopologyError(self._missing_message(absent), absent) from timed_out

    def _missing_message(self, missing: list[int]) -> str:
        if len(missing) <= _SHOWN:
            ranks = f"ranks {missing}"
        else:
            ranks = f"{len(missing)} ranks ({missing[:_SHOWN]} and {len(missing) - _SHOWN} more)"
        return (
            f"fairring: rank {self.rank} waited {self.timeout} for {ranks} of {self.size} to join "
            "the group; check that every rank was started and can reach the store"
        )

    def _unregistered(self) -> list[int]:
        """Failure path, O(N): the ranks not on this round's roster (this rank is: the key exists)."""
        present = {rank for rank, _ in self._roster()}
        return [rank for rank in range(self.size) if rank not in present]

    def _unpublished(self) -> list[int]:
        """Failure path, O(N): the ranks (all registered) that have not published their rail entry."""
        digests = sorted({digest for _, digest in self._roster()})
        members = self.store.multi_get([f"{self.round}machine/{digest}" for digest in digests])
        rails = [f"{self.round}rail/{index}" for index in range(max(len(_members(value)) for value in members))]
        # A rail's key is missing if all its ranks are: no multi_get that would block on it.
        rails = [key for key in rails if self.store.check([key])]
        present = {rank for value in self.store.multi_get(rails) for _, _, rank in _rail(value)}
        return [rank for rank in range(self.size) if rank not in present]

    def _roster(self) -> list[tuple[int, str]]:
        entries = [entry.split(",") for entry in _entries(self.store.get(f"{self.round}roster"))]
        return [(int(rank), digest) for rank, digest in entries]


def _entries(value: bytes) -> list[str]:
    """The entries of an appended list ("a;b;")."""
    return value.decode().split(";")[:-1]


def _members(value: bytes) -> list[Member]:
    members: list[Member] = []
    for entry in _entries(value):
        rank, local = entry.split(",")
        members.append((int(rank), int(local) if local else None))
    return members


def _rail(value: bytes) -> list[tuple[int, int, int]]:
    """The entries of a rail key: (machine's lowest rank, machine's size, rank)."""
    return [(int(a), int(b), int(c)) for a, b, c in (entry.split(",") for entry in _entries(value))]


def _local_order(member: Member) -> tuple[int, int]:
    # group_into_machines' order: LOCAL_RANK when given, else rank; rank breaks ties.
    rank, local = member
    return (rank if local is None else local, rank)


def _settings_conflict(winner: dict[str, Any], dissenters: list[dict[str, Any]], size: int) -> str | None:
    """check_settings_agree's message for the first variable that differs, with a bounded list of ranks."""
    names = list(winner["settings"])
    names += sorted({name for d in dissenters for name in d["settings"]} - set(names))
    for name in names:
        expected = winner["settings"].get(name)
        differing = sorted(
            (d["rank"], d["settings"].get(name)) for d in dissenters if d["settings"].get(name) != expected
        )
        if not differing:
            continue
        values = dict(sorted([(winner["rank"], expected), *differing[: _SHOWN - 1]]))
        notes = ""
        if len(differing) > _SHOWN - 1:
            notes += f"; {len(differing) - (_SHOWN - 1)} more ranks differ from rank {winner['rank']}"
        if size - 1 - len(differing) > 0:
            notes += f"; the other {size - 1 - len(differing)} ranks have rank {winner['rank']}'s value"
        return f"fairring: {name} differs across ranks ({values}{notes}); every rank of a group must use the same value"
    return None
