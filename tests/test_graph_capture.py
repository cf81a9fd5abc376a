"""CUDA graph capture, on the emulated device's model of it (csrc/device/capture.h).

On CUDA, what a stream issues during capture is recorded into a graph, not
run: an event recorded there may not be queried (by any thread), no stream
outside the capture may wait for it, and the engine, which waits on the host,
cannot be captured at all. fairring must therefore send a captured all-reduce
to the delegate (NCCL captures its own kernels), and neither track it for
memory order nor poll it for torch's hooks. No GPU runs here, so the model
stands in: a capture the test begins on its thread makes the caller's fences
and the collectives' Works "captured", and records every query of them, and
every wait for a captured fence from the engine's streams, as a violation.

Negative control: the same capture, hidden from fairring's checks
(`begin_capture(seen=False)`), must record violations: the engine takes the
all-reduces and waits for the caller's captured work, and memory order and
(where torch attaches its flight recorder) the hooks' poller query the
captured Works. tests/test_cuda.py captures real
all-reduces on a GPU and replays the graph.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from test_emulated_device import emulated

import fairring
from benchmarks.harness import Layout, RankPool
from benchmarks.reference import all_ranks_reduced, assert_matches, rank_tensor
from fairring import _C

SHAPES = [(64,), (20_000,), (50_003,)]  # one slice, several, with padding


def captured_all_reduces(seen: bool) -> dict[str, object]:
    """All-reduces and a broadcast issued inside the model's capture; what happened to them."""
    backend = fairring.backend_of()
    dist.all_reduce(torch.ones(64))  # the engine exists before the capture
    engine_ops = backend.engine_stats("cpu")["ops"]
    rank = dist.get_rank()
    tensors = [rank_tensor(rank, shape, torch.float32, seed) for seed, shape in enumerate(SHAPES)]
    _C._testing.capture_violations()  # nothing from before the capture counts
    _C._testing.begin_capture(seen)
    try:
        works = [dist.all_reduce(tensor, async_op=True) for tensor in tensors]
        for work in works:
            work.wait()
        broadcast = torch.full((16,), float(rank))
        dist.broadcast(broadcast, src=0)
    finally:
        _C._testing.end_capture()
    violations = list(_C._testing.capture_violations())
    for seed, (shape, tensor) in enumerate(zip(SHAPES, tensors, strict=True)):
        assert_matches(tensor, all_ranks_reduced(shape, torch.float32, seed=seed))
    assert torch.equal(broadcast, torch.zeros(16))
    return {
        "engine_ops_during_capture": backend.engine_stats("cpu")["ops"] - engine_ops,
        "violations": violations,
    }


@pytest.mark.timeout(180)
@pytest.mark.parametrize("seen", [True, False], ids=["seen", "negative_control"])
def test_captured_collectives_go_to_the_delegate_and_are_never_queried(seen: bool) -> None:
    with RankPool(Layout(2, 2), emulated("seed=11,jitter_us=50")) as ranks:
        outcomes = ranks.run(captured_all_reduces, seen)
    if seen:
        for outcome in outcomes:
            assert outcome == {"engine_ops_during_capture": 0, "violations": []}, outcome
        return
    # Hidden from fairring, the capture is broken: the engine took the all-reduces and waited for the
    # caller's captured work, and memory order queried what it launched.
    for outcome in outcomes:
        assert outcome["engine_ops_during_capture"] == len(SHAPES), outcome
        violations = "\n".join(outcome["violations"])
        assert "the engine made a stream wait for an event the caller recorded during graph capture" in violations
        assert "a Work issued during graph capture was queried" in violations
