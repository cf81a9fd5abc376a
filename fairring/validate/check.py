"""Inputs whose all-reduce is exact in their dtype, the expected results, and the count of wrong elements.

Rank r's element i is f(i) + g(r): f a pseudo-random pattern of -1, 0, 1 with a
prime period (so that no shard or slice boundary lines it up with itself), g(r)
= r mod 3 - 1. The sum over N ranks is N f(i) + sum of g, computed here with
plain torch, independently of any collective. Every partial sum, in whatever
order a reduction takes, is an integer of magnitude at most 2N, exact in the
dtype while 2N fits its mantissa, so results are compared exactly: a shard in
the wrong place, a rank counted twice or missing, or data left unreduced
changes most elements.
"""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# nccl-tests' names for them, for its "type" column.
TYPE_NAMES = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat16"}
# The largest integer below which every integer is exact: 2^(mantissa bits + 1).
EXACT_INTEGERS = {torch.float32: 2**24, torch.float16: 2**11, torch.bfloat16: 2**8}
PERIOD = 65521
SEED = 20240521


def max_ranks(dtype: torch.dtype) -> int:
    """The most ranks whose partial sums (|value| <= 2 per rank) stay exact in `dtype`."""
    return EXACT_INTEGERS[dtype] // 2


def _rank_term(rank: int) -> int:
    return rank % 3 - 1


def _index_pattern(count: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    period = torch.randint(-1, 2, (PERIOD,), generator=torch.Generator().manual_seed(SEED))
    return period.to(device=device, dtype=dtype).repeat(-(-count // PERIOD))[:count]


def rank_input(rank: int, count: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Rank `rank`'s input: f(i) + g(rank)."""
    return _index_pattern(count, dtype, device).add_(_rank_term(rank))


def expected_sum(world_size: int, count: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The all-reduce (sum) of every rank's rank_input: N f(i) + sum over ranks of g(r)."""
    ranks_term = sum(_rank_term(rank) for rank in range(world_size))
    pattern = _index_pattern(count, torch.float32, device)
    return pattern.mul_(world_size).add_(ranks_term).to(dtype)


def expected_result(
    collective: str, rank: int, world_size: int, count: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """What `collective` of every rank's rank_input (count elements: N chunks) leaves on `rank`.

    An all-reduce: the sum. A reduce-scatter: this rank's chunk of the sum. An
    all-gather: every rank's own chunk of its input, in rank order.
    """
    if collective == "all_reduce":
        return expected_sum(world_size, count, dtype, device)
    if collective == "reduce_scatter":
        return expected_sum(world_size, count, dtype, device).view(world_size, -1)[rank]
    chunks = [rank_input(r, count, dtype, device).view(world_size, -1)[r] for r in range(world_size)]
    return torch.cat(chunks)


def count_wrong(result: torch.Tensor, expected: torch.Tensor) -> int:
    """Elements of `result` that differ from `expected` (NaNs included)."""
    return int(torch.count_nonzero(result != expected))
