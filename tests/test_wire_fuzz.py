"""Malformed and unexpected handshakes thrown over the wire at listening ranks: each is refused, nothing else changes.

test_untrusted_peers.py calls the checks directly. Here `_C._testing.WireProbe`, a bare
TensorPipe client, opens pipes to real ranks' rails listeners and sends
scripted, then random, first messages: hellos from ranks that do not connect
there, duplicates of lanes a real peer has opened, garbage, huge and empty
metadata, hellos carrying data. A rank listens only while its mesh is being
built (then the listener closes), so the barrage is thrown while one rank is
held back and the others wait for it. Every probe's pipe must be closed by the
rank and counted, with its reason, in what the mesh reports; the mesh must
then come up and carry data correctly, with the descriptors and threads of a
mesh that nobody attacked.
"""

from __future__ import annotations

import os
import random
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import fairring
from benchmarks.harness import InitSpec, Layout, RankPool
from benchmarks.reference import rank_tensor
from fairring import _C
from nixl_support import rails_env
from scenarios import checked_all_reduces

LAYOUT = Layout(machines=2, ranks_per_machine=2)
MACHINES = [LAYOUT.ranks_of(machine) for machine in range(LAYOUT.machines)]
CONTROL = 2  # the lane a hello names for a control connection
STEP_TIMEOUT = 5.0  # seconds the probe waits for each step; a refusal takes milliseconds

# While rank 2 is held back, ranks 0, 1 and 3 listen: rank 0 (which accepts
# nobody) waits for rank 2's address, rank 1 for rank 0's control connection,
# rank 3 for rank 2's. Rank 1 has opened its lanes to rank 3 by then; nobody
# else has connected anywhere. A valid hello for a lane still free would be
# taken (the first comes first: peers are not authenticated), so the probes
# send none.
HELD = 2
VICTIMS = (0, 1, 3)
CONNECTED = {0: set(), 1: set(), 3: {(1, 0), (1, 1), (1, CONTROL)}}

# (metadata, payload lengths, tensor lengths, whether tensors name the CPU as target)
Message = tuple[bytes, list[int], list[int], bool]


def hello(rank: object, lane: object, device: object = 0) -> bytes:
    return f"fairring-rails-hello {rank} {lane} {device}".encode()


def message(metadata: bytes, payloads: list[int] | None = None, tensors: list[int] | None = None) -> Message:
    return (metadata, payloads or [], tensors or [], True)


# --- on every rank ---


def engine_state() -> dict[str, object]:
    """Checked all-reduces (the group's first makes the engine), then where this rank's rails listened."""
    checked_all_reduces(0)
    return {"rails": fairring.backend_of().rails("cpu")["description"], "extension": _C.__file__}


def process_load() -> tuple[int, int]:
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def mesh_round(port: int, prefix: str, held: int | None, seed: int) -> dict[str, object]:
    """Builds a rails mesh (`held` waits for the test's go first), checks data both ways on both
    lanes with the rail peer, and reports what the mesh rejected and this process's load."""
    rank = dist.get_rank()
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    if rank == held:
        store.wait([prefix + "go"])
    endpoint = _C._testing.RailsEndpoint(
        store, prefix, rank, MACHINES, torch.device("cpu"), timeout=timedelta(seconds=60)
    )
    machine = LAYOUT.machine_of(rank)
    peer = MACHINES[1 - machine][MACHINES[machine].index(rank)]
    received = [torch.zeros(4096) for _ in range(2)]
    transfers = [
        endpoint.send(1 - machine, lane, f"{seed}:{lane}", rank_tensor(rank, (4096,), torch.float32, seed + lane))
        for lane in range(2)
    ]
    transfers += [endpoint.expect(1 - machine, lane, f"{seed}:{lane}", received[lane]) for lane in range(2)]
    for transfer in transfers:
        transfer.wait(30)
    for lane in range(2):
        assert torch.equal(received[lane], rank_tensor(peer, (4096,), torch.float32, seed + lane)), lane
    state = {"describe": endpoint.describe(), "load": process_load()}
    dist.barrier()
    endpoint.close()
    del endpoint
    return state


# --- in the test process ---


def rejections(text: str) -> tuple[int, str]:
    """How many pipes a mesh rejected (from its describe()), and its notes on the first ones."""
    match = re.search(r"; rejected (\d+) connection\(s\):(.*)\Z", text, re.S)
    return (int(match[1]), match[2]) if match else (0, "")


def assert_refused(outcome: dict[str, object], what: object) -> None:
    """The rank took the pipe, then closed it: nothing came back, and the probe waited out no step."""
    assert outcome["reply"] is None, (what, outcome)
    assert outcome["timed_out"] == "", (what, outcome)
    assert outcome["read_error"], (what, outcome)
    assert "ECONNREFUSED" not in str(outcome["read_error"]), (what, outcome)


@pytest.fixture(scope="module")
def pool() -> Iterator[RankPool]:
    # TensorPipe's listener, also when the suite runs on NIXL (tests/test_nixl_untrusted.py is NIXL's).
    with RankPool(LAYOUT, InitSpec(timeout=timedelta(seconds=20), extra_env=rails_env("tensorpipe"))) as ranks:
        yield ranks


@pytest.fixture(scope="module")
def probe() -> _C._testing.WireProbe:
    return _C._testing.WireProbe()  # one TensorPipe context (and thread) for every pipe the tests open


@pytest.fixture(scope="module")
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))


@pytest.mark.timeout(120)
def test_a_built_engine_listens_no_more(pool: RankPool, probe: _C._testing.WireProbe) -> None:
    states = pool.run(engine_state)
    assert {state["extension"] for state in states} == {_C.__file__}, "the ranks run this checkout's extension"
    for rank, state in enumerate(states):
        rails = str(state["rails"])
        assert rejections(rails) == (0, ""), rails
        url = rails.split(" ", 1)[0]
        outcome = probe.exchange(url, [message(hello(0, 0))], True, STEP_TIMEOUT)
        assert "ECONNREFUSED" in str(outcome["write_error"]), (rank, outcome)
        # Below TensorPipe too: nothing reads a connection's first bytes any more.
        host, port = url.removeprefix("uv://").rsplit(":", 1)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=5).close()
    pool.run(checked_all_reduces, 1)


# (rank attacked, what, first messages, what the rank notes); at most 8 per rank (the notes it keeps).
SCRIPTED: list[tuple[int, str, list[Message], str]] = [
    (3, "a rank of another rail", [message(hello(0, 0))], "rank 0 on lane 0 is not a peer that connects to rank 3"),
    (3, "a rank of its machine on a data lane", [message(hello(2, 0))], "rank 2 on lane 0 is not a peer"),
    (3, "its rail peer's shards lane again", [message(hello(1, 0))], "a second hello from rank 1 on lane 0"),
    (
        3,
        "its rail peer's reduced lane again, then a shard",
        [message(hello(1, 1)), message(b"1:0:0:Float:0", tensors=[4096])],
        "a second hello from rank 1 on lane 1",
    ),
    (3, "a device a CPU mesh lacks", [message(hello(1, 0, 3))], "rank 1 named device index 3"),
    (3, "a hello with payloads", [message(hello(1, 0), payloads=[0, 64, 4096])], "a hello carried data"),
    (3, "a hello with a tensor that waits for the reader", [(hello(1, 2), [], [1 << 20], False)], "carried data"),
    (3, "no hello: closed after 0.5 s of silence", [], "a connection closed before its hello"),
    (1, "a hello with a tensor pushed at once", [message(hello(0, 1), tensors=[1 << 20])], "a hello carried data"),
    (1, "empty metadata", [message(b"")], "did not open with fairring's hello (got '')"),
    (1, "every byte value", [message(bytes(range(256)))], r"(got '\x00\x01\x02"),
    (1, "8 MiB of metadata", [message(b"fairring-rails-hello 0 2 " + b"9" * (8 << 20))], "did not open"),
    (1, "a rank number past int", [message(hello("99999999999", 2))], "did not open"),
    (
        1,
        "garbage, then more garbage with data",
        [message(b"\xff" * 32), message(b"\x00" * 9, payloads=[1, 2], tensors=[5])],
        r"(got '\xff\xff",
    ),
    (1, "50 hellos from a rank of the other machine", [message(hello(2, 0))] * 50, "rank 2 on lane 0 is not a peer"),
    (1, "the peer it waits for, on a data lane", [message(hello(0, 0))], "rank 0 on lane 0 is not a peer"),
    (
        0,
        "the rail peer it connects to",
        [message(hello(2, 0))],
        "rank 2 on lane 0 is not a peer that connects to rank 0",
    ),
    (0, "a higher local index, on control", [message(hello(1, CONTROL))], "rank 1 on lane 2 is not a peer"),
    (0, "itself", [message(hello(0, CONTROL))], "rank 0 on lane 2 is not a peer"),
]

FUZZ_CONNECTIONS = 300
ALPHABET = b"0123456789 -+x\x00\xff\n\t"
LENGTHS = (0, 1, 7, 4096, 1 << 16)


def fuzzed(rng: random.Random) -> list[Message]:
    """A hello of random numbers with random byte edits (sometimes random bytes, up to 1 MiB),
    sometimes with payloads or tensors of random counts and lengths, sometimes followed by more."""
    roll = rng.random()
    if roll < 0.1:
        metadata = rng.randbytes(rng.randrange(4096))
    elif roll < 0.12:
        metadata = rng.randbytes(1 << 20)
    else:
        chars = bytearray(hello(rng.randrange(-1, 5), rng.randrange(-1, 4), rng.choice((0, 0, 0, 1, -1))))
        for _ in range(rng.randrange(5)):
            position = rng.randrange(len(chars) + 1)
            edit = rng.choice(("flip", "drop", "double", "insert"))
            byte = rng.choice(ALPHABET) if rng.random() < 0.7 else rng.randrange(256)
            if edit == "insert" or position == len(chars):
                chars.insert(position, byte)
            elif edit == "flip":
                chars[position] = byte
            elif edit == "drop":
                del chars[position]
            else:
                chars.insert(position, chars[position])
        metadata = bytes(chars)

    def lengths() -> list[int]:
        return [rng.choice(LENGTHS) for _ in range(rng.randrange(1, 4))] if rng.random() < 0.2 else []

    first = (metadata, lengths(), lengths(), rng.random() < 0.5)
    rest = [(rng.randbytes(rng.randrange(64)), lengths(), lengths(), True) for _ in range(rng.randrange(3))]
    return [first, *(rest if rng.random() < 0.2 else [])]


def takes_a_free_lane(messages: list[Message], victim: int) -> bool:
    """Whether `messages` open with a hello the victim would accept for a lane no real peer holds yet."""
    why, rank, lane, _ = _C._testing.check_hello(messages[0][0], _C.Topology(victim, MACHINES))
    return not why and (rank, lane) not in CONNECTED[victim]


def barrage(probe: _C._testing.WireProbe, urls: dict[int, str], seed: int) -> list[int]:
    """The scripted cases, then FUZZ_CONNECTIONS random ones; returns the pipes thrown at each rank."""
    thrown = [0] * LAYOUT.world_size
    for victim, what, messages, _ in SCRIPTED:
        if messages:
            assert_refused(probe.exchange(urls[victim], messages, True, STEP_TIMEOUT), what)
        else:
            silent = probe.exchange(urls[victim], [], True, 0.5)
            assert silent["timed_out"] == "read" and silent["reply"] is None, silent
        thrown[victim] += 1
    rng = random.Random(seed)
    for _ in range(FUZZ_CONNECTIONS):
        victim = rng.choice(VICTIMS)
        messages = fuzzed(rng)
        while takes_a_free_lane(messages, victim):
            messages = fuzzed(rng)
        assert_refused(probe.exchange(urls[victim], messages, True, STEP_TIMEOUT), (victim, messages[0][0][:100]))
        thrown[victim] += 1
    return thrown


def listening_urls(store: dist.TCPStore, prefix: str) -> dict[int, str]:
    """The victims' URLs, once each has published one ("<device> <url>") and rank 1 has connected to rank 3."""
    store.wait([f"{prefix}url/{rank}" for rank in VICTIMS], timedelta(seconds=60))
    time.sleep(1)  # rank 1 connects as soon as it reads rank 3's address: on loopback, within milliseconds
    return {rank: store.get(f"{prefix}url/{rank}").decode().split(" ")[1] for rank in VICTIMS}


@pytest.mark.timeout(180)
def test_malformed_handshakes_are_refused_with_their_reason_and_change_nothing(
    pool: RankPool, probe: _C._testing.WireProbe, store: dist.TCPStore
) -> None:
    # A mesh that nobody attacks, for the load of one that was.
    store.set("clean/go", "1")
    clean = pool.run(mesh_round, store.port, "clean/", HELD, 1)
    assert all(rejections(str(state["describe"])) == (0, "") for state in clean), clean

    with ThreadPoolExecutor(1) as executor:
        attacked_round = executor.submit(pool.run, mesh_round, store.port, "attacked/", HELD, 2)
        try:
            started = time.monotonic()
            thrown = barrage(probe, listening_urls(store, "attacked/"), seed=7)
            print(f"\n{sum(thrown)} pipes thrown at ranks {VICTIMS} in {time.monotonic() - started:.1f} s")
        finally:
            store.set("attacked/go", "1")
        attacked = attacked_round.result(timeout=90)

    texts = [str(state["describe"]) for state in attacked]
    assert [rejections(text)[0] for text in texts] == thrown, texts
    for victim in VICTIMS:
        notes = rejections(texts[victim])[1]
        position = 0
        for reason in [reason for rank, _, _, reason in SCRIPTED if rank == victim][:8]:
            found = notes.find(reason, position)
            assert found >= 0, (victim, reason, notes)
            position = found + len(reason)
        # Quoted, not raw: what a probe sent can neither cut the report short nor break its encoding.
        assert re.fullmatch(r"[\x20-\x7e\t\n]*", notes) and len(notes) < 2000, notes
    for rank in range(LAYOUT.world_size):
        (clean_fds, clean_threads), (fds, threads) = clean[rank]["load"], attacked[rank]["load"]
        assert fds <= clean_fds + 2 and threads <= clean_threads, (rank, clean[rank], attacked[rank])
    # The attacked processes' engines go on too.
    pool.run(checked_all_reduces, 3)


@pytest.mark.timeout(60)
def test_a_build_that_times_out_names_the_pipes_it_rejected_quoted(probe: _C._testing.WireProbe) -> None:
    """Rank 1 of 2 machines waits for rank 0, which never comes; three pipes come instead."""
    store = dist.HashStore()
    errors: list[str] = []

    def build() -> None:
        try:
            _C._testing.RailsEndpoint(
                store, "lonely/", 1, [[0], [1]], torch.device("cpu"), timeout=timedelta(seconds=3)
            )
        except RuntimeError as error:
            errors.append(str(error))

    builder = threading.Thread(target=build)
    builder.start()
    store.wait(["lonely/url/1"], timedelta(seconds=30))
    url = store.get("lonely/url/1").decode().split(" ")[1]
    for metadata in [b"\xff\xfe\x00ok", b"fairring-rails-hello 0 0 0\xc3", hello(0, 0, 9)]:
        assert_refused(probe.exchange(url, [message(metadata)], True, STEP_TIMEOUT), metadata)
    builder.join(30)
    assert not builder.is_alive() and len(errors) == 1, errors
    error = errors[0]
    assert "timed out after 3000 ms waiting for rank(s) 0 to connect" in error, error
    assert "rejected 3 connection(s):" in error, error
    # Raw, the NUL would have cut the error short and the stray bytes made Python raise a UnicodeDecodeError.
    assert r"(got '\xff\xfe\x00ok')" in error, error
    assert r"(got 'fairring-rails-hello 0 0 0\xc3')" in error, error
    assert "rank 0 named device index 9" in error, error
