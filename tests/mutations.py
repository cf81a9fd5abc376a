"""Seeded random edits of a valid message, for the tests that fuzz a parser of peers' bytes
(tests/test_nixl_wire.py, tests/test_tensorpipe_wire.py)."""

from __future__ import annotations

import random

# Bytes every text grammar here treats specially: separators, a digit, a sign, NUL and a high byte.
COMMON_TOKENS = [b" ", b"\n", b"0", b"-", b"\x00", b"\xff"]


def mutations(seed: bytes, rng: random.Random, count: int, tokens: list[bytes]) -> list[bytes]:
    """`count` random edits of `seed`: flipped and replaced bytes, cuts, and insertions of
    COMMON_TOKENS and the grammar's own `tokens`."""
    inserted = COMMON_TOKENS + tokens
    out = []
    for _ in range(count):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            choice = rng.random()
            at = rng.randrange(len(data) + 1)
            if choice < 0.3 and data:
                data[min(at, len(data) - 1)] = rng.randrange(256)
            elif choice < 0.5:
                del data[at : at + rng.randint(1, 8)]
            else:
                data[at:at] = rng.choice(inserted)
        out.append(bytes(data))
    return out
