"""fairring's microbenchmark: `python -m fairring.bench --help`."""

from __future__ import annotations

import socket

# How the tables and readings name each baseline backend.
BASELINE_NAMES = {"gloo": "Gloo", "nccl": "NCCL"}


def free_port() -> int:
    """A TCP port free on loopback right now (for a rendezvous that starts soon after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
