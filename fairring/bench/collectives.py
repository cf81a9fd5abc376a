"""The collectives the microbenchmark times, by nccl-tests' conventions.

A size is the bytes of the N-chunk buffer: the all-reduce's tensor, the
reduce-scatter's input, the all-gather's output. The bus bandwidth is the
algorithm bandwidth times 2(N-1)/N for an all-reduce and (N-1)/N for the other
two; the hierarchical bound is the time one host's NIC takes to carry what
each machine must send: 2(M-1)/M of the size for an all-reduce, (M-1)/M for
the other two (docs/design.md, "Reduce-scatter and all-gather").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

# What one op reads and writes: (input, output); the same tensor for an all-reduce.
Buffers = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Collective:
    name: str
    # Bytes through a NIC per byte of the size, on a flat ring of N (bus) and hierarchically over M machines.
    passes: int

    def buffers(self, nbytes: int, world: int, device: torch.device | None) -> Buffers:
        """Float32 buffers of an op of about `nbytes` (a whole number of elements per rank)."""
        chunk = max(1, nbytes // 4 // world)
        if self.name == "all_reduce":
            tensor = torch.empty(chunk * world, device=device)
            return tensor, tensor
        whole, part = torch.empty(chunk * world, device=device), torch.empty(chunk, device=device)
        return (whole, part) if self.name == "reduce_scatter" else (part, whole)

    def issue(self, buffers: Buffers, group: dist.ProcessGroup) -> dist.Work:
        source, target = buffers
        if self.name == "all_reduce":
            return dist.all_reduce(target, group=group, async_op=True)
        if self.name == "reduce_scatter":
            return dist.reduce_scatter_tensor(target, source, group=group, async_op=True)
        return dist.all_gather_into_tensor(target, source, group=group, async_op=True)

    def check(self, every: list[Buffers], group: dist.ProcessGroup) -> bool:
        """Rank r contributes r + 1 everywhere: every result is exact in float32, and known."""
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        for source, _ in every:
            source.fill_(rank + 1)
        works = [self.issue(buffers, group) for buffers in every]
        for work in works:
            work.wait()
        if self.name == "all_gather":
            expected = torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(every[0][0].numel())
            return all(torch.equal(target.cpu(), expected) for _, target in every)
        return all(bool(torch.all(target == world * (world + 1) / 2)) for _, target in every)

    def bus_factor(self, world: int) -> float:
        return self.passes * (world - 1) / world

    def bound_s(self, nbytes: int, machines: int, link_bytes_per_s: float) -> float | None:
        """Time to push what each machine must send through one host's NIC: no op can beat it."""
        if link_bytes_per_s <= 0 or machines < 2:
            return None
        return self.passes * (machines - 1) / machines * nbytes / link_bytes_per_s


COLLECTIVES = {
    name: Collective(name, passes) for name, passes in (("all_reduce", 2), ("reduce_scatter", 1), ("all_gather", 1))
}
