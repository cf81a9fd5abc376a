"""What a rank accepts from peers: every field of a hello and of a control note is checked before use.

The checks are the ones the rails run on every accepted connection and every
note (csrc/rails/tensorpipe/mesh.cpp, csrc/rails/watch.cpp), called directly
with malformed and random input.
"""

from __future__ import annotations

import random

import pytest

from fairring import _C

# 3 machines x 2 ranks, seen by rank 3 (machine 1, local index 1): rank 1 (its
# rail peer on a lower machine) opens every lane, rank 2 (the lower local index
# of its machine) the control lane (2) only. Nobody else connects to it.
TOPOLOGY = _C.Topology(3, [[0, 1], [2, 3], [4, 5]])
CONTROL = 2
ACCEPTED = {(1, 0), (1, 1), (1, CONTROL), (2, CONTROL)}


def hello(rank: object, lane: object, device: object) -> str:
    return f"fairring-rails-hello {rank} {lane} {device}"


@pytest.mark.parametrize(("rank", "lane"), sorted(ACCEPTED))
def test_expected_peers_are_accepted(rank: int, lane: int) -> None:
    assert _C._testing.check_hello(hello(rank, lane, 0), TOPOLOGY) == ("", rank, lane, 0)


@pytest.mark.parametrize(
    ("text", "cuda", "refusal"),
    [
        (hello(2, 0, 0), False, "rank 2 on lane 0 is not a peer that connects to rank 3"),
        (hello(5, 0, 0), False, "rank 5 on lane 0 is not a peer"),  # a higher machine: rank 3 connects to it
        (hello(0, 0, 0), False, "rank 0 on lane 0 is not a peer"),  # another rail
        (hello(3, 2, 0), False, "rank 3 on lane 2 is not a peer"),  # itself
        (hello(1, 3, 0), False, "rank 1 on lane 3 is not a peer"),
        (hello(1, -1, 0), False, "rank 1 on lane -1 is not a peer"),
        (hello(-1, 0, 0), False, "rank -1 on lane 0 is not a peer"),
        (hello(1, 0, 1), False, "rank 1 named device index 1"),  # a CPU mesh has device 0 only
        (hello(1, 0, -1), True, "rank 1 named device index -1"),
        (hello(1, 0, 999), True, "rank 1 named device index 999"),
        (hello("99999999999999999999", 0, 0), False, "did not open with fairring's hello"),
        (hello("0x1", 0, 0), False, "did not open with fairring's hello"),
        (hello("+1", 0, 0), False, "did not open with fairring's hello"),
        ("fairring-rails-hello 1 0", False, "did not open with fairring's hello"),
        ("fairring-rails-hello 1 0 0 0", False, "did not open with fairring's hello"),
        ("fairring-rails-hello  1 0 0", False, "did not open with fairring's hello"),
        ("fairring-rails-hello 1 0 0 ", False, "did not open with fairring's hello"),
        ("fairring-rails-hello 1 0 0\n", False, "did not open with fairring's hello"),
        ("fairring-rails-hellO 1 0 0", False, "did not open with fairring's hello"),
        ("", False, "did not open with fairring's hello"),
        ("\x00" * 64, False, "did not open with fairring's hello"),
        ("x" * 100_000, False, "did not open with fairring's hello"),
    ],
)
def test_malformed_or_unexpected_hellos_are_refused_saying_why(text: str, cuda: bool, refusal: str) -> None:
    why, *_ = _C._testing.check_hello(text, TOPOLOGY, cuda)
    assert refusal in why, why
    assert len(why) < 300, "a refusal quotes at most a short prefix of what it got"


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("x" + "é" * 100, "x" + r"\xc3\xa9" * 9 + r"\xc3"),  # the 80-character limit cuts a UTF-8 sequence
        (b"\xff\xfe\x00z", r"\xff\xfe\x00z"),
        ("a\tb\nc\x7f", "a\tb\nc\\x7f"),
    ],
)
def test_refusals_quote_what_they_got_in_printable_ascii(text: str | bytes, quoted: str) -> None:
    # Raw, a NUL would cut the error short and stray bytes would make Python raise a UnicodeDecodeError.
    why, *_ = _C._testing.check_hello(text, TOPOLOGY)
    assert why == f"a connection did not open with fairring's hello (got '{quoted}')"


def test_a_cuda_mesh_accepts_any_real_device_index() -> None:
    assert _C._testing.check_hello(hello(1, 0, 7), TOPOLOGY, True) == ("", 1, 0, 7)


def mutations(seed: int, count: int) -> list[str]:
    """Random edits of valid hellos: flipped, dropped, doubled and inserted characters."""
    rng = random.Random(seed)
    alphabet = "0123456789 -+x\x00\n" + "fairng-elo"
    texts = []
    for _ in range(count):
        chars = list(hello(*rng.choice(sorted(ACCEPTED)), 0))
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(len(chars) + 1)
            edit = rng.choice(("flip", "drop", "double", "insert"))
            if edit == "insert" or position == len(chars):
                chars.insert(position, rng.choice(alphabet))
            elif edit == "flip":
                chars[position] = rng.choice(alphabet)
            elif edit == "drop":
                del chars[position]
            else:
                chars.insert(position, chars[position])
        texts.append("".join(chars))
    return texts


def test_fuzzed_hellos_are_accepted_only_from_expected_peers() -> None:
    for text in mutations(seed=11, count=5000):
        why, rank, lane, device = _C._testing.check_hello(text, TOPOLOGY)
        if why:
            continue
        assert (rank, lane) in ACCEPTED and device == 0, text
        # Accepted only if it reads as the canonical hello of those numbers (leading zeros aside).
        words = text.split(" ")
        assert words[0] == "fairring-rails-hello" and [int(w) for w in words[1:]] == [rank, lane, device], text


@pytest.mark.parametrize(
    ("text", "notice"),
    [
        ("failed 3 rank 3 (machine 1 of 3) exited", (3, "rank 3 (machine 1 of 3) exited")),
        ("failed -1 the ranks issued different all-reduces", (-1, "the ranks issued different all-reduces")),
        ("failed 0 ", (0, "")),
        (b"failed 2 a\x00b\xc3", (2, r"a\x00b\xc3")),  # quoted in every rank's errors
        ("failed 6 rank 6", None),  # no such rank in a world of 6
        ("failed -2 x", None),
        ("failed 99999999999 x", None),
        ("failed 3", None),
        ("failed  3 x", None),
        ("failed 3x y", None),
        ("failed +3 y", None),
        ("failed", None),
        ("alive", None),
        ("bye", None),
        ("", None),
    ],
)
def test_failure_notices_are_parsed_strictly(text: str | bytes, notice: tuple[int, str] | None) -> None:
    assert _C._testing.parse_notice(text, 6) == notice


def test_fuzzed_notices_never_name_a_rank_outside_the_group() -> None:
    rng = random.Random(5)
    for _ in range(5000):
        text = "failed " + "".join(rng.choice("0123456789- x\x00") for _ in range(rng.randint(0, 12)))
        parsed = _C._testing.parse_notice(text, 6)
        if parsed is not None:
            assert -1 <= parsed[0] < 6, text
