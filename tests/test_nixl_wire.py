"""The NIXL rails' text formats (csrc/rails/nixl/wire.h) parsed and written alone, without NIXL.

Notifications and staging records are a peer's bytes: every one is parsed before use. These tests
run wherever the extension builds (NIXL itself need not load): each format round-trips, each
malformed case is refused with its reason, and seeded random mutations never crash the parsers nor
yield a value outside the grammar. The end-to-end checks against a live NIXL agent are
tests/test_nixl_untrusted.py.
"""

from __future__ import annotations

import random

import pytest
from mutations import mutations

from fairring import _C

LANES = 2
MAX_NOTE = 4096
MAX_TAG = 256
# Words of the grammar that random edits insert: kinds, the largest number plus one.
NIXL_TOKENS = [b"G", b"N", b"18446744073709551616"]

MESSAGES = [
    ("G", 1, 7, 4096, 65536, b"12:0:1:Float:0"),
    ("D", 0, 0, 0, 32, b"t"),
    ("H", 1, 2**64 - 1, 0, 0, b"tag with spaces"),
    ("N", 0, 3, 0, 0, b"a note\nover lines"),
    ("N", 0, 4, 0, 0, b""),
    ("C", 0, 0, 0, 0, b"closed: rank 3 shut down"),
]

RECORD = {
    "rank": 3,
    "agent": b"fairring-3-ab12",
    "memory_type": 0,
    "device_id": 0,
    "address": 140_000_000_000,
    "bytes": 8 << 20,
    "agent_metadata": b"\x00nixl's own\nbytes\xff",
}


def encode_record(**changes: object) -> bytes:
    return _C._testing.nixl_encode_staging_record(**{**RECORD, **changes})


def grammar_violations(parsed: dict) -> list[str]:
    """What a parsed notification says that its grammar forbids (empty when none)."""
    found = []
    if parsed["kind"] not in "GDHNC":
        found.append(f"kind {parsed['kind']!r}")
    if parsed["kind"] in "GDH":
        if not 0 <= parsed["lane"] < LANES:
            found.append(f"lane {parsed['lane']}")
        if not 0 < len(parsed["text"]) <= MAX_TAG:
            found.append(f"a tag of {len(parsed['text'])} bytes")
    elif len(parsed["text"]) > MAX_NOTE:
        found.append(f"a note of {len(parsed['text'])} bytes")
    if parsed["kind"] == "G" and parsed["address"] == 0:
        found.append("a grant at address 0")
    return found


def record_violations(parsed: dict) -> list[str]:
    found = []
    if parsed["address"] == 0 or parsed["bytes"] == 0:
        found.append("staging not described")
    if not parsed["agent"] or b" " in parsed["agent"] or b"\n" in parsed["agent"]:
        found.append(f"agent {parsed['agent']!r}")
    return found


@pytest.mark.parametrize("message", MESSAGES, ids=[m[0] + str(i) for i, m in enumerate(MESSAGES)])
def test_each_notification_round_trips(message: tuple) -> None:
    kind, lane, seq, address, length, text = message
    encoded = _C._testing.nixl_encode_message(kind, lane, seq, address, length, text)
    parsed = _C._testing.nixl_parse_message(encoded, LANES, MAX_NOTE)
    assert isinstance(parsed, dict), parsed
    assert parsed["kind"] == kind and parsed["text"] == text
    if kind in "GDH":
        assert (parsed["lane"], parsed["bytes"]) == (lane, length)
    if kind != "C":
        assert parsed["seq"] == seq
    if kind == "G":
        assert parsed["address"] == address


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"fairring-nixl", "not fairring's"),
        (b"other G 0 0 1 1 t", "not fairring's"),
        (b"fairring-nixl X 0 t", "no known kind"),
        (b"fairring-nixl GG 0 0 1 1 t", "no known kind"),
        (b"fairring-nixl G 2 0 1 1 t", "no valid lane"),
        (b"fairring-nixl G -1 0 1 1 t", "no valid lane"),
        (b"fairring-nixl D 0 x 1 t", "no sequence number"),
        (b"fairring-nixl G 0 0 0 1 t", "no valid address"),
        (b"fairring-nixl G 0 0 1 1 ", "a tag of 0 bytes"),
        (b"fairring-nixl D 0 0 1 " + b"t" * (MAX_TAG + 1), f"a tag of {MAX_TAG + 1} bytes"),
        (b"fairring-nixl D 0 0 18446744073709551616 t", "no valid length"),
        (b"fairring-nixl N 0 " + b"x" * (MAX_NOTE + 1), f"a note of {MAX_NOTE + 1} bytes"),
        (b"fairring-nixl N  0 t", "no sequence number"),
    ],
)
def test_malformed_notifications_are_refused_with_their_reason(raw: bytes, reason: str) -> None:
    refused = _C._testing.nixl_parse_message(raw, LANES, MAX_NOTE)
    assert isinstance(refused, str) and reason in refused, refused


def test_the_staging_record_round_trips() -> None:
    parsed = _C._testing.nixl_parse_staging_record(encode_record())
    assert parsed == RECORD


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "not fairring's"),
        (b"fairring-nixl-md 1 3 fairring-3 0 0 4096 8", "not fairring's"),  # no newline
        (b"fairring-nixl-md 2 3 fairring-3 0 0 4096 8\n", "not fairring's"),
        (b"fairring-nixl-md 1 3 fairring-3 0 0 4096\n", "not fairring's"),
        (b"fairring-nixl-md 1 3  fairring-3 0 0 4096 8\n", "not fairring's"),
        (b"fairring-nixl-md 1 x fairring-3 0 0 4096 8\n", "not fairring's"),
        (b"fairring-nixl-md 1 3 fairring-3 0 0 0 8\n", "not described"),
        (b"fairring-nixl-md 1 3 fairring-3 0 0 4096 0\n", "not described"),
        (b"fairring-nixl-md 1 3 fairring-3 0 -1 4096 8\n", "not described"),
        (b"fairring-nixl-md 1 3 " + b"a" * 600 + b" 0 0 4096 8\n", "not fairring's"),
    ],
)
def test_malformed_staging_records_are_refused_with_their_reason(raw: bytes, reason: str) -> None:
    refused = _C._testing.nixl_parse_staging_record(raw)
    assert isinstance(refused, str) and reason in refused, refused


def test_mutated_notifications_never_crash_or_leave_the_grammar() -> None:
    rng = random.Random(20261127)
    seeds = [_C._testing.nixl_encode_message(*m) for m in MESSAGES]
    accepted = 0
    for seed in seeds:
        for raw in mutations(seed, rng, 2000, NIXL_TOKENS):
            parsed = _C._testing.nixl_parse_message(raw, LANES, MAX_NOTE)
            if isinstance(parsed, str):
                continue
            accepted += 1
            assert not grammar_violations(parsed), (raw, parsed)
            again = _C._testing.nixl_encode_message(
                parsed["kind"], parsed["lane"], parsed["seq"], parsed["address"], parsed["bytes"], parsed["text"]
            )
            assert _C._testing.nixl_parse_message(again, LANES, MAX_NOTE) == parsed, raw
    assert accepted > 100, "the mutations never produced a valid notification: they test nothing"


def test_mutated_staging_records_never_crash_or_leave_the_grammar() -> None:
    rng = random.Random(1127)
    accepted = 0
    for raw in mutations(encode_record(), rng, 5000, NIXL_TOKENS):
        parsed = _C._testing.nixl_parse_staging_record(raw)
        if isinstance(parsed, str):
            continue
        accepted += 1
        assert not record_violations(parsed), (raw, parsed)
        again = _C._testing.nixl_encode_staging_record(**parsed)
        assert _C._testing.nixl_parse_staging_record(again) == parsed, raw
    assert accepted > 100, "the mutations never produced a valid record: they test nothing"


def test_the_invariant_checks_catch_values_outside_the_grammar() -> None:
    """Negative control: the fuzz tests' checkers flag what a broken parser could return."""
    good = _C._testing.nixl_parse_message(_C._testing.nixl_encode_message(*MESSAGES[0]), LANES, MAX_NOTE)
    assert not grammar_violations(good)
    assert grammar_violations({**good, "lane": LANES})
    assert grammar_violations({**good, "address": 0})
    assert grammar_violations({**good, "text": b""})
    assert grammar_violations({**good, "kind": "N", "text": b"x" * (MAX_NOTE + 1)})
    record = _C._testing.nixl_parse_staging_record(encode_record())
    assert not record_violations(record)
    assert record_violations({**record, "bytes": 0})
    assert record_violations({**record, "agent": b"two words"})
