"""Inputs that every rank can recompute for every other rank, and expected results.

References are computed with plain torch in a wide type (float64, int64) from
the known per-rank inputs, independently of the code under test.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist

FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
INT_DTYPES = ("int8", "uint8", "int32", "int64")
ARITHMETIC_OPS = ("sum", "product", "min", "max")
BITWISE_OPS = ("band", "bor", "bxor")

REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
    "avg": dist.ReduceOp.AVG,
}

TOLERANCES = {
    torch.float16: {"rtol": 1e-2, "atol": 1e-2},
    torch.bfloat16: {"rtol": 4e-2, "atol": 4e-2},
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
}


def rank_tensor(rank: int, shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0, op: str = "sum") -> torch.Tensor:
    """Rank `rank`'s input. Values suit `op`: products stay small, sums of ints fit int8."""
    generator = torch.Generator().manual_seed(seed * 7919 + rank)
    if dtype.is_floating_point:
        values = torch.randn(shape, generator=generator, dtype=torch.float64)
        if op == "product":
            values = 0.5 + values.abs().clamp(max=1.5)
        return values.to(dtype)
    low, high = (1, 3) if op == "product" else (0, 20)
    return torch.randint(low, high, shape, generator=generator, dtype=torch.int64).to(dtype)


def reduce_reference(tensors: list[torch.Tensor], op: str) -> torch.Tensor:
    dtype = tensors[0].dtype
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stacked = torch.stack([t.to(wide) for t in tensors])
    if op == "sum":
        result = stacked.sum(0)
    elif op == "product":
        result = stacked.prod(0)
    elif op == "min":
        result = stacked.min(0).values
    elif op == "max":
        result = stacked.max(0).values
    elif op in ("band", "bor", "bxor"):
        combine = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op]
        result = functools.reduce(combine, list(stacked))
    else:
        raise ValueError(op)
    return result.to(dtype)


def all_ranks_reduced(shape: tuple[int, ...], dtype: torch.dtype, op: str = "sum", seed: int = 0) -> torch.Tensor:
    """The expected all-reduce of every rank's rank_tensor(rank, shape, dtype, seed, op)."""
    inputs = [rank_tensor(r, shape, dtype, seed, op) for r in range(dist.get_world_size())]
    return reduce_reference(inputs, op)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual, expected, **TOLERANCES.get(actual.dtype, {"rtol": 0, "atol": 0}))


# A sum of n values, rounded to a half type after each addition in any order and at the end, is
# within n * u * sum(|x|) of the exact sum (u: the type's unit roundoff). With many ranks the
# partial sums grow, and that bound outgrows TOLERANCES' fixed one.
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def assert_sum_within_rounding(actual: torch.Tensor, inputs: list[torch.Tensor]) -> None:
    """`actual` is the sum of `inputs` (half types) within TOLERANCES or the rounding bound, each element."""
    unit = UNIT_ROUNDOFF[actual.dtype]
    wide = torch.stack([t.to(torch.float64) for t in inputs])
    exact = wide.sum(0)
    tolerance = TOLERANCES[actual.dtype]
    allowed = torch.maximum(len(inputs) * unit * wide.abs().sum(0), tolerance["atol"] + tolerance["rtol"] * exact.abs())
    error = (actual.to(torch.float64) - exact).abs()
    worst = int((error - allowed).argmax())
    got, wanted, bound = (t.flatten()[worst].item() for t in (actual, exact, allowed))
    assert bool((error <= allowed).all()), (
        f"{int((error > allowed).sum())} of {error.numel()} elements off; "
        f"at flat index {worst}: {got} vs {wanted}, allowed {bound}"
    )


def assert_all_ranks_reduced(
    actual: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, op: str = "sum", seed: int = 0
) -> None:
    """assert_matches(actual, all_ranks_reduced(...)); a half-type sum within its rounding bound."""
    if op != "sum" or dtype not in UNIT_ROUNDOFF:
        assert_matches(actual, all_ranks_reduced(shape, dtype, op, seed))
        return
    assert actual.dtype == dtype and actual.shape == shape, (actual.dtype, actual.shape)
    assert_sum_within_rounding(actual, [rank_tensor(r, shape, dtype, seed, op) for r in range(dist.get_world_size())])


def topology_view(topology: Any) -> dict[str, object]:
    """What one rank's `_C.Topology` knows of the layout, as plain data."""
    return {
        "machine": topology.machine,
        "local_ranks": list(topology.local_ranks),
        "machine_sizes": list(topology.machine_sizes),
        "rail_peers": list(topology.rail_peers),
    }


def expected_view(machines: list[list[int]], rank: int) -> dict[str, object]:
    """`topology_view` of `rank` in the whole layout `machines`, worked out independently."""
    machine = next(m for m, ranks in enumerate(machines) if rank in ranks)
    sizes = [len(ranks) for ranks in machines]
    local_index = machines[machine].index(rank)
    regular = len(set(sizes)) == 1
    return {
        "machine": machine,
        "local_ranks": machines[machine],
        "machine_sizes": sizes,
        "rail_peers": [ranks[local_index] for ranks in machines] if regular else [],
    }
