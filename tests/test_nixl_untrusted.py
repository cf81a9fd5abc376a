"""Strangers at the NIXL rails: notifications from an agent that is no neighbour, and bytes thrown at UCX's sockets.

A stranger that can read the group's store can load a rank's agent metadata and send it
notifications. Each must be refused and counted (`Backend.rails()`), and the ranks must go on
giving correct results. Then random bytes go to every TCP port the ranks' processes listen on
besides the store (UCX's), and the ranks must still be there and correct.
"""

from __future__ import annotations

import os
import random
import re
import socket
import time

import pytest
import torch.distributed as dist

import fairring
from benchmarks.harness import InitSpec, Layout, RankPool
from nixl_support import NIXL_ENV, needs_nixl
from scenarios import checked_all_reduces

pytestmark = needs_nixl

LAYOUT = Layout(machines=2, ranks_per_machine=2)
SCRIPTED = [
    b"",
    b"fairring-nixl ",
    b"fairring-nixl G 0 0 1 1 tag",  # a grant from a stranger
    b"fairring-nixl D 0 0 4096 0:0:0:Float:0",  # data it never wrote
    b"fairring-nixl N 0 failed 0 a stranger's failure notice",
    b"fairring-nixl C closed",
    b"fairring-nixl G 7 18446744073709551615 0 0 t",
    b"\x00" * 64,
    b"\xff" * 5000,
]
FUZZED = 200


def published_metadata() -> tuple[int, bytes, str]:
    """Checked all-reduces (the first makes the engine); this rank's pid, published NIXL metadata and rails."""
    checked_all_reduces(0)
    # What torch gives a backend made for the CPU: the group's store, prefixed "cpu/".
    store = dist.PrefixStore("cpu/", dist.distributed_c10d._world.pg_map[dist.group.WORLD][1])
    value = store.get(f"fairring/rails/cpu/nixl/{dist.get_rank()}")
    return os.getpid(), bytes(value), fairring.backend_of().rails("cpu")["description"]


def rails_after_checks(seed: int) -> str:
    checked_all_reduces(seed)
    return fairring.backend_of().rails("cpu")["description"]


def refused(rails: str) -> int:
    found = re.search(r"refused (\d+) notification", rails)
    return int(found.group(1)) if found else 0


def fuzzed(rng: random.Random) -> bytes:
    kind = rng.choice("GDHNCX")
    fields = [str(rng.choice([0, 1, 2, rng.getrandbits(64)])) for _ in range(rng.randint(0, 5))]
    text = " ".join(fields) + " " + "".join(chr(rng.randint(0, 255)) for _ in range(rng.randint(0, 40)))
    if rng.random() < 0.2:
        return rng.randbytes(rng.randint(0, 300))
    return f"fairring-nixl {kind} {text}".encode("latin-1")


def listening_ports(pid: int, exclude: set[int]) -> set[int]:
    """TCP ports the process `pid` listens on (state 0A in /proc/net/tcp*), minus `exclude`."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports - exclude


@pytest.mark.timeout(240)
def test_strangers_notifications_are_refused_and_counted_and_change_nothing() -> None:
    from nixl_cu13 import nixl_agent, nixl_agent_config

    with RankPool(LAYOUT, InitSpec(extra_env=NIXL_ENV)) as ranks:
        published = ranks.run(published_metadata)
        assert all(refused(rails) == 0 for _, _, rails in published), published
        stranger = nixl_agent("fairring-stranger", nixl_agent_config(backends=["UCX"]))
        rng = random.Random(7)
        thrown = []
        for _, value, _ in published:
            agent = stranger.add_remote_agent(value[value.index(b"\n") + 1 :])
            messages = SCRIPTED + [fuzzed(rng) for _ in range(FUZZED)]
            for message in messages:
                stranger.send_notif(agent, message)
            thrown.append(len(messages))
        deadline = time.monotonic() + 30
        while True:
            rails = ranks.run(rails_after_checks, 1)
            counts = [refused(text) for text in rails]
            if counts == thrown or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert counts == thrown, (counts, thrown, rails)
        assert all("agent 'fairring-stranger', no neighbour" in text for text in rails), rails


@pytest.mark.timeout(240)
def test_random_bytes_at_ucx_sockets_leave_the_ranks_correct() -> None:
    with RankPool(LAYOUT, InitSpec(extra_env=NIXL_ENV)) as ranks:
        # Those listening before the engine are Gloo's and the store's, not the rails'.
        before = {pid: listening_ports(pid, exclude=set()) for pid in ranks.run(os.getpid)}
        published = ranks.run(published_metadata)
        rng = random.Random(11)
        hit = 0
        for pid, _, _ in published:
            ports = listening_ports(pid, exclude=before[pid])
            print(f"fairring: rank process {pid} listens for UCX on {sorted(ports)}")
            for port in ports:
                for _ in range(5):
                    try:
                        with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
                            connection.sendall(rng.randbytes(rng.choice([1, 8, 64, 4096])))
                            hit += 1
                    except OSError:
                        pass  # a port that closed or reset is a refusal too
        assert hit > 0, "no UCX socket was found to throw bytes at"
        ranks.run(rails_after_checks, 2)
