"""The NIXL mesh's flow control and trust checks, over a fake NIXL: ranks 0 and 1 as two meshes in
this process (csrc/testing/fake_nixl_pair.h), no NIXL needed, so every run of the tests has them.
Covers rails/nixl/mesh.cpp, data_link.cpp, control_link.cpp and peers.cpp; the fake copies bytes
synchronously, so what a test sees does not hang on timing. The misbehaving peer is the test,
injecting notifications in rank 0's name; the processes on real NIXL are test_nixl_rails.py's and
test_nixl_untrusted.py's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fairring import _C

KiB = 1024
WAIT_S = 5.0
TARGET = 4 * KiB  # each message's bytes
REFUSED = "rail peer 0 sent what the NIXL rails refuse: "


@pytest.fixture
def pair() -> Iterator[_C._testing.FakeNixlPair]:
    made = _C._testing.FakeNixlPair(64 * KiB)
    try:
        yield made
    finally:
        made.shutdown()


def outcome(pair: _C._testing.FakeNixlPair, op: int) -> dict:
    done = pair.wait(op, WAIT_S)
    assert done is not None, f"op {op} did not finish within {WAIT_S} s"
    return done


def test_a_granted_message_lands_in_the_readers_target(pair: _C._testing.FakeNixlPair) -> None:
    read = pair.receive(1, "shard", 0, TARGET)
    write = pair.send(0, "shard", 8 * KiB, TARGET, 7)
    assert outcome(pair, write)["error"] == ""
    got = outcome(pair, read)
    assert (got["error"], got["tag"], got["bytes"]) == ("", b"shard", TARGET)
    assert got["data"] == bytes([7]) * TARGET


def test_a_write_waits_for_its_grant(pair: _C._testing.FakeNixlPair) -> None:
    write = pair.send(0, "shard", 0, TARGET, 3)
    assert pair.wait(write, 0.2) is None, "a write finished before its reader granted memory"
    assert "1 write(s) waited for their grant" in pair.describe(0)
    read = pair.receive(1, "shard", 0, TARGET)
    assert outcome(pair, write)["error"] == ""
    assert outcome(pair, read)["data"] == bytes([3]) * TARGET


def test_a_message_other_than_granted_is_reported_and_nothing_written(pair: _C._testing.FakeNixlPair) -> None:
    read = pair.receive(1, "shard", 0, TARGET)
    write = pair.send(0, "other", 0, TARGET, 9)
    # The sender declines the grant (a header, no bytes); the reader learns what came instead.
    assert outcome(pair, write)["error"] == ""
    got = outcome(pair, read)
    assert (got["error"], got["tag"], got["bytes"]) == ("", b"other", TARGET)
    assert got["data"] == bytes(TARGET), "a declined message wrote into the reader's target"


def messages_through_one_target(slow_receiver_ms: int, ungranted_writes: bool, count: int = 40) -> list[int]:
    """`count` messages queued at once, each read into the same target once the last was taken, as the
    engine reuses a staging slot: the indices of those whose bytes were not their own."""
    pair = _C._testing.FakeNixlPair(count * TARGET, slow_receiver_ms, ungranted_writes)
    try:
        # Each from bytes of its own, which no later message reuses before it is written.
        fills = [index % 250 + 1 for index in range(count)]
        writes = [pair.send(0, "shard", index * TARGET, TARGET, fill) for index, fill in enumerate(fills)]
        wrong = []
        for index, fill in enumerate(fills):
            got = outcome(pair, pair.receive(1, "shard", 0, TARGET))
            assert got["error"] == "", got
            if got["data"] != bytes([fill]) * TARGET:
                wrong.append(index)
        assert all(outcome(pair, write)["error"] == "" for write in writes)
        return wrong
    finally:
        pair.shutdown()


def test_a_slow_reader_gets_every_message_in_memory_it_granted() -> None:
    assert messages_through_one_target(slow_receiver_ms=2, ungranted_writes=False) == []


def test_negative_control_writes_without_grants_overwrite_what_the_reader_holds() -> None:
    # FAIRRING_TEST_NIXL_UNGRANTED_WRITES's sender writes each message into the last grant at once:
    # the check above must see that as wrong bytes, or it could not see a broken flow control.
    assert messages_through_one_target(slow_receiver_ms=2, ungranted_writes=True) != []


# Notifications in rank 0's name that rank 1 must refuse, and why, once rank 1 has received message 0
# from rank 0 and sent it message 0, then granted a read (sequence 1) and queued a write (sequence 1).
FORGED = {
    "garbage": (b"not a notification", "a notification that is not fairring's"),
    "lane out of range": (b"fairring-nixl G 7 1 {inside} 16 shard", "lane"),
    "grant outside staging": (b"fairring-nixl G 0 1 {outside} 4096 shard", "it granted memory outside its staging"),
    "grant repeated": (b"fairring-nixl G 0 0 {inside} 4096 shard", "grant 0 out of order"),
    "data unasked for": (b"fairring-nixl D 0 5 4096 shard", "message 5 arrived unasked for"),
    "data of another message": (b"fairring-nixl D 0 1 4096 other", "it wrote another message than granted"),
    "header of the granted message": (b"fairring-nixl H 0 1 4096 shard", "it declined a message it was granted"),
    "data on the control lane": (b"fairring-nixl N 0 hello", ""),
}


@pytest.mark.parametrize("case", [case for case in FORGED if case != "data on the control lane"])
def test_a_peer_that_breaks_the_protocol_loses_its_links_named(pair: _C._testing.FakeNixlPair, case: str) -> None:
    exchanged = [pair.receive(0, "shard", 0, TARGET), pair.send(1, "shard", 0, TARGET, 1)]
    exchanged += [pair.receive(1, "shard", 0, TARGET), pair.send(0, "shard", 0, TARGET, 1)]
    assert [outcome(pair, op)["error"] for op in exchanged] == [""] * 4
    read = pair.receive(1, "shard", 0, TARGET)
    write = pair.send(1, "shard", 0, TARGET, 2)
    assert pair.wait(write, 0.1) is None, "the write should wait for rank 0's grant"
    template, reason = FORGED[case]
    inside = pair.staging_address(0)
    bytes_ = template.replace(b"{inside}", b"%d" % inside).replace(b"{outside}", b"%d" % (inside + 64 * KiB))
    assert pair.inject(pair.agent(0), 1, bytes_)
    for op in (read, write):
        error = outcome(pair, op)["error"]
        assert error.startswith(REFUSED) and reason in error, (case, error)
    assert "refused 1 notification(s), first: " + REFUSED in pair.describe(1)
    # Its control connection fails too, now and for later notes.
    assert outcome(pair, pair.read_note(1))["error"].startswith(REFUSED)
    assert outcome(pair, pair.send_note(1, "later"))["error"].startswith(REFUSED)


def test_a_strangers_notifications_are_counted_and_change_nothing(pair: _C._testing.FakeNixlPair) -> None:
    read = pair.receive(1, "shard", 0, TARGET)
    for forged, _ in FORGED.values():
        assert pair.inject("fairring-rank9-0", 1, forged)
    write = pair.send(0, "shard", 0, TARGET, 5)
    assert outcome(pair, write)["error"] == ""
    assert outcome(pair, read)["data"] == bytes([5]) * TARGET
    assert f"refused {len(FORGED)} notification(s), first: a notification from agent 'fairring-rank9-0'" in (
        pair.describe(1)
    )


def test_notes_reach_their_reader_in_the_senders_order(pair: _C._testing.FakeNixlPair) -> None:
    # NIXL may deliver notifications out of order: note 1 comes first, and waits for note 0.
    agent = pair.agent(0)
    assert pair.inject(agent, 1, b"fairring-nixl N 1 second")
    first = pair.read_note(1)
    assert pair.wait(first, 0.1) is None, "note 1 was handed over before note 0"
    assert pair.inject(agent, 1, b"fairring-nixl N 0 first")
    second = pair.read_note(1)
    assert [outcome(pair, op)["tag"] for op in (first, second)] == [b"first", b"second"]
    assert pair.inject(agent, 1, b"fairring-nixl N 1 again")
    assert outcome(pair, pair.read_note(1))["error"] == REFUSED + "note 1 out of order"


def test_a_peers_close_fails_what_waits_on_it_naming_it(pair: _C._testing.FakeNixlPair) -> None:
    read = pair.receive(1, "shard", 0, TARGET)
    write = pair.send(1, "shard", 0, TARGET, 2)
    assert pair.inject(pair.agent(0), 1, b"fairring-nixl C closed by rank 0")
    for op in (read, write):
        assert outcome(pair, op)["error"] == "rail peer 0 closed its rails (closed by rank 0)"
    assert "refused" not in pair.describe(1), "a close is no refusal"


def test_shutdown_fails_what_is_pending() -> None:
    pair = _C._testing.FakeNixlPair(64 * KiB)
    read, note = pair.receive(1, "shard", 0, TARGET), pair.read_note(1)
    # Rank 0 shuts down first, so rank 1 may learn of it from rank 0's close notice, or when its own
    # notice cannot reach rank 0's agent, before its own shutdown: each way, nothing waits on.
    pair.shutdown()
    assert outcome(pair, read)["error"] in (
        "the rails were closed on rank 1",
        "rail peer 0 closed its rails (closed by rank 0)",
    )
    assert outcome(pair, note)["error"] in (
        "the rails shut down",
        "NIXL could not reach rail peer 0: NIXL_CAPI_ERROR_BACKEND (-2)",
    )
