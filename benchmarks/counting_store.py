"""A store client that counts what crosses: tests/test_rendezvous.py's measure of the rendezvous's store
traffic, and benchmarks/rendezvous_sim.py's at thousands of simulated ranks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

INT_BYTES = 8


class CountingStore:
    """Forwards one rank's store calls to a client, counting calls (round trips) and bytes.

    `sent` and `received` count everything that crosses (integers 8 bytes each way);
    `values_read` and `bytes_received` the values read only.
    """

    def __init__(self, store: dist.Store) -> None:
        self.store = store
        self.calls: Counter[str] = Counter()
        self.sent = 0
        self.received = 0
        self.values_read = 0
        self.bytes_received = 0

    def _count(self, kind: str, sent: Sequence[str | bytes] = (), received: Sequence[bytes] = ()) -> None:
        self.calls[kind] += 1
        self.sent += sum(len(item.encode() if isinstance(item, str) else item) for item in sent)
        self.values_read += len(received)
        self.bytes_received += sum(len(item) for item in received)
        self.received += sum(len(item) for item in received)

    def add(self, key: str, value: int) -> int:
        self._count("add", [key])
        self.sent += INT_BYTES
        self.received += INT_BYTES
        return self.store.add(key, value)

    def append(self, key: str, value: str) -> None:
        self._count("append", [key, value])
        self.store.append(key, value)

    def check(self, keys: list[str]) -> bool:
        self._count("check", keys)
        return self.store.check(keys)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        value = self.store.compare_set(key, expected, desired)
        self._count("compare_set", [key, expected, desired], [value])
        return value

    def get(self, key: str) -> bytes:
        value = self.store.get(key)
        self._count("get", [key], [value])
        return value

    def multi_get(self, keys: list[str]) -> list[bytes]:
        values = self.store.multi_get(keys)
        self._count("multi_get", keys, values)
        return values

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        self._count("multi_set", [*keys, *values])
        self.store.multi_set(keys, values)

    def set(self, key: str, value: str) -> None:
        self._count("set", [key, value])
        self.store.set(key, value)

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        self._count("wait", keys)
        self.store.wait(keys, timeout)
