"""Proof that all-reduces take the Herring path: bytes through each host's NIC.

Each emulated machine is a separate host (a network namespace with its own
eth0), so a host's NIC counters count exactly what crosses its boundary. With
M machines an all-reduce of S bytes must send about 2(M-1)/M x S per host,
spread over its rails, where a flat ring over all N ranks sends 2(N-1)/N x S.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import Layout, RankPool
from benchmarks.reference import all_ranks_reduced, assert_matches, rank_tensor
from fairring.bench.netns import NetnsCluster, netns_available

MiB = 1 << 20
_state: dict[str, object] = {}


@pytest.fixture(scope="module", autouse=True)
def _needs_namespaces() -> None:
    available, reason = netns_available()
    if not available:
        pytest.skip(f"network namespaces unavailable: {reason}")


def prepare(numel: int) -> None:
    _state["tensor"] = rank_tensor(dist.get_rank(), (numel,), torch.float32)
    _state["gloo"] = dist.new_group(backend="gloo")
    # Warm up both paths, so the measured op moves only its own bytes.
    for group in (None, _state["gloo"]):
        dist.all_reduce(torch.ones(4096), group=group)


def all_reduce_prepared(backend: str) -> None:
    tensor = _state["tensor"].clone()
    group = _state["gloo"] if backend == "gloo" else None
    dist.all_reduce(tensor, group=group)
    numel = tensor.numel()
    assert_matches(tensor, all_ranks_reduced((numel,), torch.float32))


def tx_bytes_per_host(cluster: NetnsCluster, ranks: RankPool, backend: str) -> list[int]:
    before = [cluster.counters(host)[0] for host in cluster.hosts]
    ranks.run(all_reduce_prepared, backend)
    return [cluster.counters(host)[0] - b for host, b in zip(cluster.hosts, before, strict=True)]


@pytest.mark.timeout(300)
# 3x2, interleaved: the extended tier (27 s on 2 cores); its 2x2 run checks the same figure in CI.
@pytest.mark.parametrize(
    "layout", [Layout(2, 2), pytest.param(Layout(3, 2, interleaved=True), marks=pytest.mark.extended)], ids=str
)
def test_bytes_through_each_host_match_the_hierarchical_figure(layout: Layout) -> None:
    size_bytes = 24 * MiB
    numel = size_bytes // 4
    machines, ranks_total = layout.machines, layout.world_size
    hierarchical = 2 * (machines - 1) / machines * size_bytes
    flat_ring = 2 * (ranks_total - 1) / ranks_total * size_bytes
    with NetnsCluster(machines) as cluster, RankPool(layout, hosts=cluster.hosts) as ranks:
        ranks.run(prepare, numel)
        fairring_tx = tx_bytes_per_host(cluster, ranks, "fairring")
        gloo_tx = tx_bytes_per_host(cluster, ranks, "gloo")
    print(f"\n{layout}: S={size_bytes} hierarchical={hierarchical:.0f} flat ring={flat_ring:.0f}")
    print(f"fairring tx per host: {fairring_tx} ({[round(t / hierarchical, 3) for t in fairring_tx]} x hierarchical)")
    print(f"gloo tx per host:     {gloo_tx} ({[round(t / flat_ring, 3) for t in gloo_tx]} x flat ring)")
    for fairring_bytes, gloo_bytes in zip(fairring_tx, gloo_tx, strict=True):
        # Payload plus Ethernet/IP/TCP framing and ACKs (well under 10%).
        assert hierarchical <= fairring_bytes <= 1.10 * hierarchical
        assert fairring_bytes < 0.8 * gloo_bytes
