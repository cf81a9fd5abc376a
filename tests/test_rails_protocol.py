"""The rails protocol on its own (csrc/rails/lanes.*), over a real TensorPipe mesh.

Two processes are two machines of one rank each; `_C._testing.RailsEndpoint` exposes
the protocol the engine uses: tagged messages per (peer, lane), read strictly
in the order the receiver expects them, into the receiver's own memory.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import Layout, RankPool
from fairring import _C

SHARDS, REDUCED = 0, 1
_prefixes = itertools.count()


@pytest.fixture(scope="module")
def pair() -> RankPool:
    with RankPool(Layout(2, 1)) as ranks:
        yield ranks


def endpoint(prefix: str) -> _C._testing.RailsEndpoint:
    store = dist.distributed_c10d._get_default_store()
    return _C._testing.RailsEndpoint(store, f"rails-test/{prefix}/", dist.get_rank(), [[0], [1]], torch.device("cpu"))


def in_order_on_each_lane(prefix: str) -> list[list[float]]:
    """Rank 0 sends 4 messages per lane; rank 1 reads lane 1 completely before lane 0."""
    ep = endpoint(prefix)
    peer = 1 - dist.get_rank()
    if dist.get_rank() == 0:
        sends = [
            ep.send(peer, lane, f"{lane}:{i}", torch.full((1000,), float(10 * lane + i)))
            for i in range(4)
            for lane in (SHARDS, REDUCED)
        ]
        for transfer in sends:
            transfer.wait(30)
        received: list[list[float]] = []
    else:
        received = []
        # The reduced lane never waits behind unread shards: lanes are independent.
        for lane in (REDUCED, SHARDS):
            targets = [torch.zeros(1000) for _ in range(4)]
            transfers = [ep.expect(peer, lane, f"{lane}:{i}", t) for i, t in enumerate(targets)]
            for transfer in transfers:
                transfer.wait(30)
            received.append([t.unique().tolist() for t in targets])
    dist.barrier()
    ep.close()
    return received


def test_messages_arrive_in_order_into_the_receivers_memory(pair: RankPool) -> None:
    _, received = pair.run(in_order_on_each_lane, f"order{next(_prefixes)}")
    assert received == [[[10.0], [11.0], [12.0], [13.0]], [[0.0], [1.0], [2.0], [3.0]]]


def mismatched(prefix: str, sent_tag: str, sent_numel: int) -> str:
    """Rank 1 expects 'op:1' of 100 floats; rank 0 sends something else. Each returns its error."""
    ep = endpoint(prefix)
    try:
        if dist.get_rank() == 0:
            ep.send(1, SHARDS, sent_tag, torch.ones(sent_numel)).wait(30)
            # The receiver closes the mesh on a mismatch: a later transfer fails here too.
            ep.expect(1, REDUCED, "never", torch.zeros(4)).wait(30)
        else:
            ep.expect(0, SHARDS, "op:1", torch.zeros(100)).wait(30)
    except RuntimeError as error:
        return str(error)
    finally:
        dist.barrier()
        ep.close()
    return "no error"


@pytest.mark.parametrize(("tag", "numel"), [("op:2", 100), ("op:1", 99)], ids=["tag", "size"])
def test_an_unexpected_message_fails_both_ends_naming_the_peer(pair: RankPool, tag: str, numel: int) -> None:
    sender, receiver = pair.run(mismatched, f"mismatch{next(_prefixes)}", tag, numel, timeout=90)
    assert "rail peer rank 0" in receiver and "expected 'op:1' (400 bytes)" in receiver, receiver
    assert f"got '{tag}' ({numel * 4} bytes)" in receiver and "different all-reduces" in receiver, receiver
    assert "rail peer rank 1" in sender, sender


def closed_by_peer(prefix: str) -> str:
    ep = endpoint(prefix)
    try:
        if dist.get_rank() == 0:
            dist.barrier()  # rank 1 has posted its receive
            ep.close()
            return "closed"
        transfer = ep.expect(0, SHARDS, "op:1", torch.zeros(10))
        dist.barrier()
        transfer.wait(30)
    except RuntimeError as error:
        return str(error)
    return "no error"


def test_a_peer_that_closes_fails_pending_receives_at_once(pair: RankPool) -> None:
    _, receiver = pair.run(closed_by_peer, f"close{next(_prefixes)}", timeout=60)
    assert "receiving a message from rail peer rank 0" in receiver and "failed" in receiver, receiver


def bad_requests(prefix: str) -> list[str]:
    ep = endpoint(prefix)
    errors = []
    peer = 1 - dist.get_rank()
    for request in (
        lambda: ep.send(peer, 2, "x", torch.zeros(4)),
        lambda: ep.expect(peer, SHARDS, "x", torch.zeros(4, 4).t()),
        lambda: ep.send(dist.get_rank(), SHARDS, "x", torch.zeros(4)),
    ):
        try:
            request()
            errors.append("no error")
        except RuntimeError as error:
            errors.append(str(error))
    dist.barrier()
    ep.close()
    return errors


def test_bad_requests_are_refused_up_front(pair: RankPool) -> None:
    for lane, layout, own_machine in pair.run(bad_requests, f"bad{next(_prefixes)}"):
        assert "lane must be 0 (shards) or 1 (reduced), not 2" in lane
        assert "contiguous" in layout
        assert "no rail" in own_machine
