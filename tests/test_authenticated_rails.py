"""Only the group's own ranks get onto its TensorPipe rails: forgers that know the wire format, not the key.

Every rails pipe opens with a challenge-response on the group's rails key (csrc/rails/tensorpipe/
handshake.h). A forger here is the test process with `_C._testing.WireProbe`: it finds where a rank
listens (from the store, as a port scan would) while the peer that rank waits for is held back, and
claims that peer's lanes with a proof of its own making. The MACs a forger or a control computes come
from Python's hmac, not from the code under test. Each refusal has its negative control: the same
forgery taken where the listener does not check proofs (FAIRRING_TEST_RAILS_PROOF_UNCHECKED=1), or a
fresh proof made with the real key taken where a replayed one was not.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import InitSpec, Layout, RankFailure, RankPool
from benchmarks.reference import rank_tensor
from fairring import _C
from scenarios import checked_all_reduces

pytestmark = pytest.mark.skipif(
    not _C.build_info()["tensorpipe"], reason="this build has no TensorPipe rails (their forgers test NIXL's)"
)

LAYOUT = Layout(machines=2, ranks_per_machine=1)
MACHINES = [[0], [1]]
DIALLER, LISTENER = 0, 1  # rank 0, on the lower machine, dials rank 1 on every lane
LANES = (0, 1, 2)  # shards, reduced, control
STEP_TIMEOUT = 5.0
PROOF_UNCHECKED = "FAIRRING_TEST_RAILS_PROOF_UNCHECKED"
SECRET = "an-operator-secret-of-32-bytes!!"


def hello(rank: int, lane: int) -> str:
    return f"fairring-rails-hello {rank} {lane} 0"


def handshake_mac(key: bytes, role: str, hello_text: str, listener_nonce: bytes, dialler_nonce: bytes) -> bytes:
    """The handshake's MAC as handshake.h defines it, computed by Python's hmac."""
    signed = f"fairring-rails {role}\n{hello_text}\n".encode() + listener_nonce + b"\n" + dialler_nonce
    return hmac.new(key, signed, hashlib.sha256).digest()


def listener_nonce(challenge: bytes) -> bytes:
    word, nonce = challenge.decode().split(" ")
    assert word == "fairring-rails-challenge" and len(nonce) == 32, challenge
    return bytes.fromhex(nonce)


def proof(key: bytes, hello_text: str, challenge: bytes) -> bytes:
    """The proof a dialler holding `key` gives for `challenge`."""
    dialler_nonce = os.urandom(16)
    mac = handshake_mac(key, "dialler", hello_text, listener_nonce(challenge), dialler_nonce)
    return f"fairring-rails-proof {dialler_nonce.hex()} {mac.hex()}".encode()


def assert_refused(outcome: dict[str, object], what: str) -> None:
    """The listener challenged, read the answer, and closed the pipe without a welcome."""
    assert outcome["challenge"] is not None, (what, outcome)
    assert outcome["reply"] is None and outcome["read_error"] and outcome["timed_out"] == "", (what, outcome)


def rejections(describe: str) -> str:
    return describe.split("; rejected ", 1)[1] if "; rejected " in describe else ""


# --- on every rank ---


def rails_round(port: int, prefix: str, secrets: list[str], timeout_s: float, encrypt: bool = False) -> str:
    """Builds the rails (the dialler waits for the test's go), checks data both ways on both lanes,
    and returns what the mesh says of itself, rejections included."""
    rank = dist.get_rank()
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    if rank == DIALLER:
        store.wait([prefix + "go"])
    endpoint = _C._testing.RailsEndpoint(
        store,
        prefix,
        rank,
        MACHINES,
        torch.device("cpu"),
        _C.RailsNetwork(secret=secrets[rank], encrypt=encrypt),
        timeout=timedelta(seconds=timeout_s),
    )
    exchange(endpoint, rank, seed=0)
    described = endpoint.describe()
    endpoint.close()
    return described


def exchanged(endpoint: _C._testing.RailsEndpoint, rank: int, seed: int) -> list[bool]:
    """Data both ways on both lanes with the rail peer: whether what came on each lane is what it sent."""
    peer = 1 - rank  # its machine, too
    received = [torch.zeros(4096) for _ in range(2)]
    sent = [rank_tensor(rank, (4096,), torch.float32, seed + lane) for lane in (0, 1)]
    transfers = [endpoint.send(peer, lane, f"{seed}:{lane}", sent[lane]) for lane in (0, 1)]
    transfers += [endpoint.expect(peer, lane, f"{seed}:{lane}", received[lane]) for lane in (0, 1)]
    for transfer in transfers:
        transfer.wait(30)
    return [torch.equal(received[lane], rank_tensor(peer, (4096,), torch.float32, seed + lane)) for lane in (0, 1)]


def exchange(endpoint: _C._testing.RailsEndpoint, rank: int, seed: int) -> None:
    assert exchanged(endpoint, rank, seed) == [True, True]


def tampered_round(port: int, prefix: str, encrypt: bool) -> str:
    """Rank 0 sends with FAIRRING_TEST_RAILS_TAMPER=1 (one byte of each data message flipped on the
    wire): what rank 1 got, "intact", "altered" (wrong data accepted) or the error its transfer raised."""
    rank = dist.get_rank()
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    endpoint = _C._testing.RailsEndpoint(
        store, prefix, rank, MACHINES, torch.device("cpu"), _C.RailsNetwork(encrypt=encrypt)
    )
    try:
        outcome = exchanged(endpoint, rank, seed=0)
    except RuntimeError as error:
        return str(error)
    finally:
        endpoint.close()
    return "intact" if all(outcome) else "altered"


def switched_round(port: int, prefix: str, timeout_s: float) -> None:
    """Rails built, used, switched (the dialler waits for the test's go first), and used again."""
    rank = dist.get_rank()
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    endpoint = _C._testing.RailsEndpoint(
        store, prefix, rank, MACHINES, torch.device("cpu"), timeout=timedelta(seconds=timeout_s)
    )
    exchange(endpoint, rank, seed=0)
    if rank == DIALLER:
        store.wait([prefix + "go"])
    endpoint.switch_rail(1 - rank, 1, timeout=timedelta(seconds=timeout_s))
    exchange(endpoint, rank, seed=1)
    endpoint.close()


# --- in the test process ---


@pytest.fixture(scope="module")
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))


@pytest.fixture(scope="module")
def probe() -> _C._testing.WireProbe:
    return _C._testing.WireProbe()


def listening_url(store: dist.Store, prefix: str, rank: int = LISTENER) -> str:
    store.wait([f"{prefix}url/{rank}"], timedelta(seconds=60))
    return store.get(f"{prefix}url/{rank}").decode().split(" ")[1]


def attacked_round(
    store: dist.TCPStore,
    prefix: str,
    attack: object,
    rank_env: dict[int, dict[str, str]] | None = None,
    secrets: tuple[str, str] = ("", ""),
    timeout_s: float = 30.0,
    switch: bool = False,
    encrypt: bool = False,
) -> list[str]:
    """A rails round on two fresh ranks, with attack(url) run against the listener while the dialler is
    held back (at the build, or with `switch` at a rail switch after it); raises the ranks' RankFailure
    if the round fails."""
    with RankPool(LAYOUT, rank_env=rank_env) as ranks:
        result: dict[str, object] = {}

        def run() -> None:
            try:
                if switch:
                    result["ok"] = ranks.run(switched_round, store.port, prefix, timeout_s, timeout=90)
                else:
                    result["ok"] = ranks.run(
                        rails_round, store.port, prefix, list(secrets), timeout_s, encrypt, timeout=90
                    )
            except RankFailure as failure:
                result["failure"] = failure

        runner = threading.Thread(target=run)
        runner.start()
        try:
            if switch:
                store.wait([f"{prefix}switch/0-1/1"], timedelta(seconds=60))
                attack(store.get(f"{prefix}switch/0-1/1").decode().split(" ")[3])  # type: ignore[operator]
            else:
                attack(listening_url(store, prefix))  # type: ignore[operator]
        finally:
            store.set(prefix + "go", "1")
            runner.join(120)
        assert not runner.is_alive()
        if "failure" in result:
            raise result["failure"]  # type: ignore[misc]
        return result["ok"]  # type: ignore[return-value]


@pytest.mark.timeout(120)
def test_a_forger_without_the_key_is_refused_and_the_job_goes_on(
    store: dist.TCPStore, probe: _C._testing.WireProbe
) -> None:
    wrong_key = os.urandom(32)

    def attack(url: str) -> None:
        for lane in LANES:
            text = hello(DIALLER, lane)
            assert_refused(probe.handshake(url, text, lambda c, t=text: proof(wrong_key, t, c), STEP_TIMEOUT), lane)
        assert_refused(probe.handshake(url, hello(DIALLER, 0), lambda c: b"garbage", STEP_TIMEOUT), "garbage")
        assert_refused(probe.handshake(url, hello(DIALLER, 1), lambda c: c, STEP_TIMEOUT), "its own challenge back")

    described = attacked_round(store, "forged/", attack)
    notes = rejections(described[LISTENER])
    assert notes.startswith("5 connection(s):"), described
    assert notes.count("without its proof: its proof does not show this group's rails key") == 3, notes
    assert notes.count("where its proof was expected") == 2, notes
    assert rejections(described[DIALLER]) == "", described


def switch_hello(lane: int) -> str:
    """Rank 0's hello for rail switch 1 (wire.h): its generation and received counts follow."""
    return f"{hello(DIALLER, lane)} 1 1 1"


@pytest.mark.timeout(120)
def test_a_forger_at_a_rail_switch_is_refused_and_the_switch_goes_on(
    store: dist.TCPStore, probe: _C._testing.WireProbe
) -> None:
    def attack(url: str) -> None:
        for lane in LANES:
            text = switch_hello(lane)
            assert_refused(
                probe.handshake(url, text, lambda c, t=text: proof(os.urandom(32), t, c), STEP_TIMEOUT), lane
            )

    attacked_round(store, "switch-forged/", attack, switch=True)  # data before and after the switch, checked


@pytest.mark.timeout(120)
@pytest.mark.parametrize("switch", [False, True], ids=["at-the-build", "at-a-switch"])
def test_negative_control_without_the_proof_check_a_forger_takes_a_lane(
    store: dist.TCPStore, probe: _C._testing.WireProbe, switch: bool
) -> None:
    welcomed: list[dict[str, object]] = []
    text = switch_hello(0) if switch else hello(DIALLER, 0)

    def attack(url: str) -> None:
        welcomed.append(probe.handshake(url, text, lambda c: proof(os.urandom(32), text, c), STEP_TIMEOUT))

    with pytest.raises(RankFailure) as failure:
        attacked_round(
            store, f"unchecked-{switch}/", attack, rank_env={LISTENER: {PROOF_UNCHECKED: "1"}}, timeout_s=10,
            switch=switch,
        )  # fmt: skip
    reply = welcomed[0]["reply"]
    assert isinstance(reply, bytes) and reply.startswith(b"fairring-rails-welcome "), welcomed
    # The forger holds rank 0's shards lane: the real rank 0 is turned away from it (refused as a second
    # hello, its handshake ends early), and rank 1 expects shards from a closed pipe.
    assert "connecting to rank 1 at uv://" in str(failure.value), failure.value


@contextmanager
def lonely_listener(
    secret: str = "", store: dist.Store | None = None, prefix: str = "lonely/"
) -> Iterator[tuple[dist.Store, str, list[str]]]:
    """Rank 1 of 2 machines, building its rails in a thread of this process; rank 0 never comes, so the
    build ends in a timeout (its error is yielded in the list once the block ends)."""
    store = dist.HashStore() if store is None else store
    errors: list[str] = []

    def build() -> None:
        try:
            _C._testing.RailsEndpoint(
                store,
                prefix,
                LISTENER,
                MACHINES,
                torch.device("cpu"),
                _C.RailsNetwork(secret=secret),
                timeout=timedelta(seconds=3),
            )
        except RuntimeError as error:
            errors.append(str(error))

    builder = threading.Thread(target=build)
    builder.start()
    try:
        yield store, listening_url(store, prefix), errors
    finally:
        builder.join(30)
    assert not builder.is_alive() and len(errors) == 1, errors


@pytest.mark.timeout(60)
def test_a_replayed_proof_is_refused_where_a_fresh_one_with_the_key_is_taken(probe: _C._testing.WireProbe) -> None:
    text = hello(DIALLER, 0)
    with lonely_listener() as (store, url, errors):
        key = store.get("lonely/key")  # what a recorder of a real handshake would need to have had
        recorded: list[bytes] = []

        def record(challenge: bytes) -> bytes:
            recorded.append(proof(key, text, challenge))
            return b"fairring-rails-proof " + b"0" * 32 + b" " + b"0" * 64  # sent elsewhere, not here

        assert_refused(probe.handshake(url, text, record, STEP_TIMEOUT), "recording")
        assert_refused(probe.handshake(url, text, lambda c: recorded[0], STEP_TIMEOUT), "the replay")
        # The control: the same key, answering this challenge, is taken, and the listener proves itself.
        fresh: list[bytes] = []

        def answer(challenge: bytes) -> bytes:
            fresh.extend([challenge, proof(key, text, challenge)])
            return fresh[1]

        taken = probe.handshake(url, text, answer, STEP_TIMEOUT)
        reply = taken["reply"]
        assert isinstance(reply, bytes), taken
        dialler_nonce = bytes.fromhex(fresh[1].decode().split(" ")[1])
        expected = handshake_mac(key, "listener", text, listener_nonce(fresh[0]), dialler_nonce)
        assert reply == b"fairring-rails-welcome " + expected.hex().encode(), taken
    assert "rejected 2 connection(s)" in errors[0], errors


@pytest.mark.timeout(60)
def test_with_an_operator_secret_the_store_gives_a_forger_nothing(probe: _C._testing.WireProbe) -> None:
    text = hello(DIALLER, 2)
    with lonely_listener(SECRET) as (store, url, errors):
        stored = store.get("lonely/key")
        assert len(stored) == 32
        assert_refused(probe.handshake(url, text, lambda c: proof(stored, text, c), STEP_TIMEOUT), "the store's value")
        # The control: the key the secret derives (rails_key.h) is taken.
        derived = hmac.new(SECRET.encode(), b"fairring rails key\n" + stored, hashlib.sha256).digest()
        taken = probe.handshake(url, text, lambda c: proof(derived, text, c), STEP_TIMEOUT)
        assert isinstance(taken["reply"], bytes) and taken["reply"].startswith(b"fairring-rails-welcome "), taken
    assert "rejected 1 connection(s)" in errors[0], errors


@pytest.mark.timeout(120)
def test_ranks_with_different_secrets_fail_naming_the_setting(store: dist.TCPStore) -> None:
    # The control first: the same secret on both ranks carries data.
    same = attacked_round(store, "same-secret/", lambda url: None, secrets=(SECRET, SECRET))
    assert [rejections(text) for text in same] == ["", ""], same
    with pytest.raises(RankFailure) as failure:
        attacked_round(store, "two-secrets/", lambda url: None, secrets=(SECRET, SECRET[::-1]), timeout_s=10)
    message = str(failure.value)
    assert "do all ranks have the same FAIRRING_RAILS_SECRET?" in message, message


@pytest.mark.timeout(60)
def test_each_group_meets_a_key_of_its_own() -> None:
    # Two groups' rails in one store, as torch prefixes each group's keys: each draws its own key.
    store = dist.HashStore()
    with lonely_listener(store=store, prefix="group-a/"), lonely_listener(store=store, prefix="group-b/"):
        keys = {store.get(f"{prefix}key") for prefix in ("group-a/", "group-b/")}
    assert len(keys) == 2 and all(len(key) == 32 for key in keys), keys


# --- values published in the store (the NIXL rails' staging records) ---


def python_seal(key: bytes, store_key: str, value: bytes) -> bytes:
    """rails/auth/sealed.h's seal, by Python's hmac."""
    mac = hmac.new(key, b"fairring sealed store value\n" + store_key.encode() + b"\n" + value, hashlib.sha256)
    return value + mac.digest()


def test_a_sealed_store_value_opens_only_with_its_key_and_under_its_store_key() -> None:
    key, record = os.urandom(32), b"fairring-nixl-staging 3 ...\n\x00\x01binary agent metadata"
    sealed = python_seal(key, "fairring/rails/cpu/nixl/3", record)
    assert _C._testing.seal_for_store(key, "fairring/rails/cpu/nixl/3", record) == sealed
    assert _C._testing.open_from_store(key, "fairring/rails/cpu/nixl/3", sealed) == record  # the control
    # A forger without the key, a record moved to another rank's key, one edited, one cut short.
    assert (
        _C._testing.open_from_store(
            key, "fairring/rails/cpu/nixl/3", python_seal(os.urandom(32), "fairring/rails/cpu/nixl/3", record)
        )
        is None
    )
    assert _C._testing.open_from_store(key, "fairring/rails/cpu/nixl/2", sealed) is None
    assert _C._testing.open_from_store(key, "fairring/rails/cpu/nixl/3", sealed[:5] + b"X" + sealed[6:]) is None
    assert _C._testing.open_from_store(key, "fairring/rails/cpu/nixl/3", sealed[:31]) is None


# --- encryption (FAIRRING_RAILS_ENCRYPT) ---

TAMPER = "FAIRRING_TEST_RAILS_TAMPER"


@pytest.mark.timeout(120)
def test_encrypted_rails_carry_data_exactly(store: dist.TCPStore) -> None:
    described = attacked_round(store, "encrypted/", lambda url: None, encrypt=True)
    assert [rejections(text) for text in described] == ["", ""], described


@pytest.mark.timeout(120)
@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypted", "negative-control-plain"])
def test_a_message_altered_on_the_wire_is_refused_where_the_rails_encrypt(store: dist.TCPStore, encrypt: bool) -> None:
    with RankPool(LAYOUT, rank_env={DIALLER: {TAMPER: "1"}}) as ranks:
        sender, receiver = ranks.run(tampered_round, store.port, f"tampered-{encrypt}/", encrypt, timeout=90)
    if encrypt:
        # Rank 1's transfers from rank 0 fail, naming why; no altered byte was written to its memory.
        assert "failed its authentication: it was altered, replayed or reordered on the wire" in receiver, receiver
    else:
        # The control: unencrypted, the same flipped byte lands in rank 1's memory unnoticed, while
        # what rank 1 sent, untampered, arrives intact.
        assert (sender, receiver) == ("intact", "altered")


def engine_rails() -> str:
    import fairring

    checked_all_reduces(0)  # the group's first makes the engine; each result checked
    return str(fairring.backend_of().rails("cpu")["description"])


@pytest.mark.timeout(180)
def test_an_engine_on_encrypted_rails_reduces_exactly() -> None:
    # Data lanes and control notes, through the engine, 2 machines x 2 ranks.
    with RankPool(Layout(2, 2), InitSpec(extra_env={"FAIRRING_RAILS_ENCRYPT": "1"})) as ranks:
        described = ranks.run(engine_rails)
        ranks.run(checked_all_reduces, 1)
    assert all("authenticated, encrypted (AES-256-GCM)" in text for text in described), described
