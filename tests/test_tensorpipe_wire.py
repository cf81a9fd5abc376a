"""The TensorPipe rails' texts (csrc/rails/tensorpipe/wire.h) parsed and written alone: the hello
that opens every pipe and the address record each rank publishes in the store.

Both are a peer's bytes. Each round-trips, each malformed case is refused with its reason, and
seeded random mutations never crash a parser nor yield a value outside the grammar. What a value
means for the reader (a peer that connects here, a device it can use) is checked by
`check_hello` (tests/test_untrusted_peers.py) and, end to end, by tests/test_wire_fuzz.py.
"""

from __future__ import annotations

import random

import pytest
from mutations import mutations

from fairring import _C

T = _C._testing
INT_MAX = 2**31 - 1
URL = b"uv://127.0.0.1:40211"
TOKENS = [b"fairring-rails-hello", b"uv://", b"2147483648", b"\t"]


# Negative numbers are the grammar's: the reader's checks refuse them (tests/test_untrusted_peers.py).
@pytest.mark.parametrize("fields", [(0, 0, 0), (7, 2, 3), (INT_MAX, INT_MAX, INT_MAX), (-1, -2, -INT_MAX - 1)])
def test_the_hello_round_trips(fields: tuple[int, int, int]) -> None:
    raw = T.tensorpipe_encode_hello(*fields)
    assert raw == b"fairring-rails-hello %d %d %d" % fields
    assert T.tensorpipe_parse_hello(raw) == dict(zip(("rank", "lane", "device_index"), fields, strict=True))


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "did not open with fairring's hello"),
        (b"fairring-rails-hello 1 2", "did not open with fairring's hello"),
        (b"fairring-rails-hello 1 2 3 4", "did not open with fairring's hello"),
        (b"fairring-rails-hello  1 2 3", "did not open with fairring's hello"),
        (b"fairring-rails-hello 1 2 3 ", "did not open with fairring's hello"),
        (b"hello 1 2 3", "did not open with fairring's hello"),
        (b"fairring-rails-hello -01 2 3", "did not open with fairring's hello"),
        (b"fairring-rails-hello 1 2 -", "did not open with fairring's hello"),
        (b"fairring-rails-hello 1 x 3", "did not open with fairring's hello"),
        (b"fairring-rails-hello 1 2 2147483648", "did not open with fairring's hello"),
        (b"fairring-rails-hello +1 2 3", "did not open with fairring's hello"),
        (b"fairring-rails-hello -0 2 3", "did not open with fairring's hello"),
        (b"fairring-rails-hello 01 2 3", "did not open with fairring's hello"),
    ],
)
def test_malformed_hellos_are_refused_with_their_reason(raw: bytes, reason: str) -> None:
    refused = T.tensorpipe_parse_hello(raw)
    assert isinstance(refused, str) and reason in refused, refused


def test_the_address_record_round_trips() -> None:
    raw = T.tensorpipe_encode_address_record(3, URL)
    assert raw == b"3 " + URL
    assert T.tensorpipe_parse_address_record(raw) == {"device_index": 3, "url": URL}
    ipv6 = b"uv://[fd00::1]:5000"
    assert T.tensorpipe_parse_address_record(b"0 " + ipv6) == {"device_index": 0, "url": ipv6}


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        URL,
        b"0",
        b"0 " + URL + b" extra",
        b"-0 " + URL,
        b"00 " + URL,
        b"x " + URL,
        b"0 tcp://127.0.0.1:1",
        b"0 uv://",
        b"0 uv://127.0.0.1\n:1",
        b"0 uv://\xff",
        b"0 uv://" + b"a" * 600,
    ],
)
def test_malformed_address_records_are_refused(raw: bytes) -> None:
    refused = T.tensorpipe_parse_address_record(raw)
    assert isinstance(refused, str) and "a malformed address" in refused, refused


def hello_violations(parsed: dict) -> list[str]:
    return [f"{key} {value}" for key, value in parsed.items() if not -INT_MAX - 1 <= value <= INT_MAX]


def record_violations(parsed: dict) -> list[str]:
    found = hello_violations({"device_index": parsed["device_index"]})
    url = parsed["url"]
    if not url.startswith(b"uv://") or len(url) == 5 or any(byte < 0x21 or byte > 0x7E for byte in url):
        found.append(f"url {url!r}")
    return found


def test_mutated_hellos_never_crash_or_leave_the_grammar() -> None:
    rng = random.Random(20261127)
    accepted = 0
    for raw in mutations(T.tensorpipe_encode_hello(12, 1, 0), rng, 5000, TOKENS):
        parsed = T.tensorpipe_parse_hello(raw)
        if isinstance(parsed, str):
            continue
        accepted += 1
        assert not hello_violations(parsed), (raw, parsed)
        assert T.tensorpipe_encode_hello(parsed["rank"], parsed["lane"], parsed["device_index"]) == raw
    # A hello leaves little room for an edit that keeps it valid (23 of these 5000 do).
    assert accepted > 10, "the mutations never produced a valid hello: they test nothing"


def test_mutated_address_records_never_crash_or_leave_the_grammar() -> None:
    rng = random.Random(1127)
    accepted = 0
    for raw in mutations(T.tensorpipe_encode_address_record(0, URL), rng, 5000, TOKENS):
        parsed = T.tensorpipe_parse_address_record(raw)
        if isinstance(parsed, str):
            continue
        accepted += 1
        assert not record_violations(parsed), (raw, parsed)
        assert T.tensorpipe_encode_address_record(parsed["device_index"], parsed["url"]) == raw
    assert accepted > 100, "the mutations never produced a valid record: they test nothing"


def test_the_invariant_checks_catch_values_outside_the_grammar() -> None:
    """Negative control: the fuzz tests' checkers flag what a broken parser could return."""
    assert not hello_violations({"rank": 0, "lane": 2, "device_index": 0})
    assert hello_violations({"rank": -INT_MAX - 2, "lane": 2, "device_index": 0})
    assert hello_violations({"rank": 0, "lane": 2, "device_index": INT_MAX + 1})
    assert not record_violations({"device_index": 0, "url": URL})
    assert record_violations({"device_index": 0, "url": b"uv://"})
    assert record_violations({"device_index": 0, "url": b"uv://a b"})
    assert record_violations({"device_index": 0, "url": b"tcp://a"})


# A rail switch's hello (rails/failover.h): three more numbers, the switch first (never 0).
def test_a_switch_hello_round_trips() -> None:
    raw = T.tensorpipe_encode_hello(3, 2, 0, generation=4, received_shards=17, received_reduced=2**64 - 1)
    assert raw == b"fairring-rails-hello 3 2 0 4 17 %d" % (2**64 - 1)
    assert T.tensorpipe_parse_hello(raw) == {
        "rank": 3,
        "lane": 2,
        "device_index": 0,
        "generation": 4,
        "received": (17, 2**64 - 1),
    }


@pytest.mark.parametrize(
    "raw",
    [
        b"fairring-rails-hello 1 2 3 0 5 6",  # switch 0 is the mesh's first connection, which has none
        b"fairring-rails-hello 1 2 3 1 5",
        b"fairring-rails-hello 1 2 3 1 5 6 7",
        b"fairring-rails-hello 1 2 3 1 -5 6",
        b"fairring-rails-hello 1 2 3 1 05 6",
        b"fairring-rails-hello 1 2 3 1 5 %d" % 2**64,
    ],
)
def test_malformed_switch_hellos_are_refused(raw: bytes) -> None:
    refused = T.tensorpipe_parse_hello(raw)
    assert isinstance(refused, str) and "did not open with fairring's hello" in refused, refused


def test_the_switch_record_round_trips_and_refuses_malformed_ones() -> None:
    raw = T.tensorpipe_encode_switch_record(1, 5, 6, URL)
    assert raw == b"1 5 6 " + URL
    assert T.tensorpipe_parse_switch_record(raw) == {"device_index": 1, "received": (5, 6), "url": URL}
    for bad in (b"1 5 " + URL, b"1 5 6 7 " + URL, b"1 -5 6 " + URL, b"1 5 06 " + URL, b"1 5 6 tcp://x:1"):
        refused = T.tensorpipe_parse_switch_record(bad)
        assert isinstance(refused, str) and "malformed switch record" in refused, (bad, refused)


def test_acked_notes_parse_only_as_written() -> None:
    assert T.parse_acked_note("acked 3 0") == (3, 0)
    for bad in ("acked 3", "acked 3 0 1", "acked -3 0", "acked 03 0", "acked  3 0", "acked 3 x", "ack 3 0"):
        assert T.parse_acked_note(bad) is None, bad
