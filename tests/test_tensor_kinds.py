"""Complex, sparse, bool, non-contiguous, empty, 0-dim and small-integer tensors: each all-reduce gives
a correct result, checked against plain torch arithmetic on every rank's input, or a clear error.

Cases run on 2 machines x 2 ranks, on the world group ("engine": FAIRRING_FLAT_THRESHOLD=0, so the engine
takes every dtype and op it can) and on a fairring group whose threshold sends every all-reduce here to the
delegate ("flat": Gloo). Kinds the engine does not take (bool, sparse, other dtypes) go to Gloo on both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import Layout, RankPool, make_flat_group
from benchmarks.reference import REDUCE_OPS, TOLERANCES, rank_tensor, reduce_reference

LAYOUT = Layout(2, 2)
PATHS = ("engine", "flat")
_groups: dict[str, dist.ProcessGroup] = {}


def make_groups() -> None:
    _groups["engine"] = dist.group.WORLD
    _groups["flat"] = make_flat_group("1GiB")
    _groups["gloo"] = dist.new_group(backend="gloo")


@pytest.fixture(scope="module")
def ranks() -> Iterator[RankPool]:
    with RankPool(LAYOUT) as pool:
        pool.run(make_groups)
        yield pool


def inputs_of(make: Callable[[int], torch.Tensor]) -> list[torch.Tensor]:
    return [make(rank) for rank in range(dist.get_world_size())]


def then_still_in_step(path: str) -> None:
    """A plain all-reduce after the case: every rank is still at the same point of the group's sequence."""
    tensor = rank_tensor(dist.get_rank(), (5,), torch.float64, seed=99)
    dist.all_reduce(tensor, group=_groups[path])
    expected = reduce_reference(inputs_of(lambda r: rank_tensor(r, (5,), torch.float64, seed=99)), "sum")
    torch.testing.assert_close(tensor, expected)


# Complex: c10d all-reduces a real view for SUM, AVG and PREMUL_SUM and refuses the rest.


def complex_input(rank: int, dtype: torch.dtype) -> torch.Tensor:
    real, imaginary = (rank_tensor(rank, (3, 13), torch.float64, seed) for seed in (10, 11))
    return torch.complex(real, imaginary).to(dtype)


def complex_all_reduce(dtype_name: str, op: str, path: str) -> None:
    dtype = getattr(torch, dtype_name)
    rank, size = dist.get_rank(), dist.get_world_size()
    tensor = complex_input(rank, dtype)
    factor = 0.5 + rank
    reduce_op = dist._make_nccl_premul_sum(factor) if op == "premul_sum" else REDUCE_OPS[op]
    dist.all_reduce(tensor, op=reduce_op, group=_groups[path])
    inputs = [complex_input(r, torch.complex128) for r in range(size)]
    weights = [0.5 + r if op == "premul_sum" else 1.0 for r in range(size)]
    expected = sum(w * x for w, x in zip(weights, inputs, strict=True)) / (size if op == "avg" else 1)
    real_tolerance = TOLERANCES[torch.float32 if dtype == torch.complex64 else torch.float64]
    torch.testing.assert_close(tensor, expected.to(dtype), **real_tolerance)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", ["sum", "avg", "premul_sum"])
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_sums_are_correct(ranks: RankPool, dtype: str, op: str, path: str) -> None:
    ranks.run(complex_all_reduce, dtype, op, path)


def rejected(kind: str, op: str, path: str) -> str:
    """The error of all-reducing a `kind` tensor with `op`; then checks the group is still in step."""
    if kind == "complex":
        tensor = torch.ones(4, dtype=torch.complex64)
    else:
        tensor = sparse_input(dist.get_rank(), (9,), torch.float32, 0)
    try:
        dist.all_reduce(tensor, op=REDUCE_OPS[op], group=_groups[path])
    except (RuntimeError, ValueError) as error:
        message = f"{type(error).__name__}: {error}"
    else:
        message = "no error"
    then_still_in_step(path)
    return message


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", ["max", "min", "product"])
def test_complex_comparisons_and_products_fail_clearly(ranks: RankPool, op: str, path: str) -> None:
    for message in ranks.run(rejected, "complex", op, path):
        assert "does not support" in message and op.upper() in message and "complex" in message, message


# Sparse COO tensors go to the delegate's allreduce_sparse.


def sparse_input(rank: int, shape: tuple[int, ...], dtype: torch.dtype, dense_dims: int) -> torch.Tensor:
    """Uncoalesced, with repeated indices, different on every rank."""
    generator = torch.Generator().manual_seed(40 + rank)
    sparse_shape, dense_shape = shape[: len(shape) - dense_dims], shape[len(shape) - dense_dims :]
    nnz = 3 + rank
    indices = torch.stack([torch.randint(0, n, (nnz,), generator=generator) for n in sparse_shape])
    values = torch.randint(-9, 10, (nnz, *dense_shape), generator=generator).to(dtype)
    return torch.sparse_coo_tensor(indices, values, shape, check_invariants=True)


def sparse_sum(shape: tuple[int, ...], dtype_name: str, dense_dims: int, path: str) -> None:
    dtype = getattr(torch, dtype_name)
    tensor = sparse_input(dist.get_rank(), shape, dtype, dense_dims)
    dist.all_reduce(tensor, group=_groups[path])
    expected = sum(t.to_dense() for t in inputs_of(lambda r: sparse_input(r, shape, dtype, dense_dims)))
    assert tensor.is_sparse and tensor.shape == shape and tensor.dtype == dtype
    torch.testing.assert_close(tensor.to_dense(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("shape", "dtype", "dense_dims"),
    [((17,), "float32", 0), ((5, 7), "float64", 0), ((6, 3), "int64", 1)],
    ids=["1d-float32", "2d-float64", "hybrid-int64"],
)
def test_sparse_coo_sum_matches_the_dense_sum(
    ranks: RankPool, shape: tuple[int, ...], dtype: str, dense_dims: int, path: str
) -> None:
    ranks.run(sparse_sum, shape, dtype, dense_dims, path)


@pytest.mark.parametrize("path", PATHS)
def test_sparse_max_fails_clearly(ranks: RankPool, path: str) -> None:
    for message in ranks.run(rejected, "sparse", "max", path):
        assert "sparse" in message and "ReduceOp.SUM" in message, message


def csr_rejected(path: str) -> str:
    try:
        dist.all_reduce(torch.eye(3).to_sparse_csr(), group=_groups[path])
    except NotImplementedError as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize("path", [*PATHS, "gloo"])
def test_sparse_csr_is_refused_before_any_backend_as_with_gloo(ranks: RankPool, path: str) -> None:
    # torch's dispatcher has no c10d all-reduce for CSR: the error names the layout, for Gloo too.
    for message in ranks.run(csr_rejected, path):
        assert "SparseCsr" in message and "allreduce" in message, message


# Bool: c10d's reductions are logical (SUM and MAX are OR, MIN and PRODUCT are AND).


def bool_input(rank: int) -> torch.Tensor:
    return torch.randint(0, 2, (4, 9), generator=torch.Generator().manual_seed(50 + rank)).bool()


def bool_all_reduce(op: str, path: str) -> None:
    tensor, beside_gloo = bool_input(dist.get_rank()), bool_input(dist.get_rank())
    dist.all_reduce(tensor, op=REDUCE_OPS[op], group=_groups[path])
    dist.all_reduce(beside_gloo, op=REDUCE_OPS[op], group=_groups["gloo"])
    stacked = torch.stack(inputs_of(bool_input))
    expected = stacked.any(0) if op in ("sum", "max") else stacked.all(0)
    assert torch.equal(tensor, expected) and torch.equal(beside_gloo, expected), (tensor, beside_gloo, expected)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", ["sum", "max", "min", "product"])
def test_bool_reductions_are_logical_like_gloo(ranks: RankPool, op: str, path: str) -> None:
    ranks.run(bool_all_reduce, op, path)


# Non-contiguous views: the view is reduced in place, and its base elsewhere is left as it was.

VIEWS: dict[str, tuple[tuple[int, ...], Callable[[torch.Tensor], torch.Tensor]]] = {
    "transposed": ((6, 10), lambda base: base.t()),
    "permuted": ((3, 4, 5), lambda base: base.permute(2, 0, 1)),
    "strided-slice": ((40,), lambda base: base[1::3]),
    "column-slice": ((8, 12), lambda base: base[:, 2:7]),
}
# The delegate (Gloo) would read and write a view with gaps as if it were contiguous; fairring hands it a
# contiguous copy and copies the result back. The engine copies such views and back itself.


def view_all_reduce(view: str, dtype_name: str, op: str, path: str) -> None:
    shape, make_view = VIEWS[view]
    dtype = getattr(torch, dtype_name)

    def base_of(rank: int) -> torch.Tensor:
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=torch.Generator().manual_seed(60 + rank)).bool()
        return rank_tensor(rank, shape, dtype, seed=60)

    base = base_of(dist.get_rank())
    target = make_view(base)
    assert not target.is_contiguous()
    dist.all_reduce(target, op=REDUCE_OPS[op], group=_groups[path])
    views = [make_view(b).contiguous() for b in inputs_of(base_of)]
    expected_base = base_of(dist.get_rank())
    if dtype == torch.bool:
        make_view(expected_base).copy_(torch.stack(views).any(0))
    else:
        make_view(expected_base).copy_(reduce_reference(views, op))
    assert torch.equal(base, expected_base), (base, expected_base)


@pytest.mark.parametrize(
    ("view", "path"),
    [
        ("transposed", "engine"),
        ("transposed", "flat"),
        ("permuted", "engine"),
        ("permuted", "flat"),
        ("strided-slice", "engine"),
        ("strided-slice", "flat"),
        ("column-slice", "engine"),
        ("column-slice", "flat"),
    ],
)
def test_non_contiguous_views_are_reduced_in_place(ranks: RankPool, view: str, path: str) -> None:
    ranks.run(view_all_reduce, view, "int64", "sum", path)


@pytest.mark.parametrize("view", ["strided-slice", "transposed"])
def test_non_contiguous_bool_views_take_the_delegate_on_any_group(ranks: RankPool, view: str) -> None:
    ranks.run(view_all_reduce, view, "bool", "max", "engine")


# Empty and 0-dim tensors.


def shaped_all_reduce(shape: tuple[int, ...], dtype_name: str, op: str, path: str) -> None:
    dtype = getattr(torch, dtype_name)
    tensor = rank_tensor(dist.get_rank(), shape, dtype, seed=70, op=op)
    dist.all_reduce(tensor, op=REDUCE_OPS[op], group=_groups[path])
    inputs = inputs_of(lambda r: rank_tensor(r, shape, dtype, seed=70, op=op))
    if op == "avg":
        expected = (reduce_reference(inputs, "sum").double() / len(inputs)).to(dtype)
    else:
        expected = reduce_reference(inputs, op)
    assert tensor.shape == shape and tensor.dtype == dtype
    torch.testing.assert_close(tensor, expected, **TOLERANCES.get(dtype, {"rtol": 0, "atol": 0}))
    then_still_in_step(path)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5)], ids=str)
@pytest.mark.parametrize(("dtype", "op"), [("float32", "sum"), ("int64", "max"), ("float16", "avg")])
def test_zero_element_tensors(ranks: RankPool, shape: tuple[int, ...], dtype: str, op: str, path: str) -> None:
    ranks.run(shaped_all_reduce, shape, dtype, op, path)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("dtype", "op"), [("float32", "sum"), ("float64", "avg"), ("bfloat16", "max"), ("int32", "product")]
)
def test_zero_dim_tensors(ranks: RankPool, dtype: str, op: str, path: str) -> None:
    ranks.run(shaped_all_reduce, (), dtype, op, path)


# uint8 and int8.


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", ["sum", "product", "min", "max", "band", "bor", "bxor"])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_eight_bit_integers(ranks: RankPool, dtype: str, op: str, path: str) -> None:
    ranks.run(shaped_all_reduce, (3, 11), dtype, op, path)


def wrapping_sum(dtype_name: str, path: str) -> None:
    """Sums past the type's range wrap around, as torch's own integer arithmetic does."""
    dtype = getattr(torch, dtype_name)

    def value(rank: int) -> torch.Tensor:
        return torch.tensor([100 + rank, -100 - rank if dtype.is_signed else 200 + rank, 1], dtype=dtype)

    tensor = value(dist.get_rank())
    dist.all_reduce(tensor, group=_groups[path])
    total = torch.stack([v.long() for v in inputs_of(value)]).sum(0)
    low = -128 if dtype.is_signed else 0
    assert torch.equal(tensor, ((total - low) % 256 + low).to(dtype)), (tensor, total)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_eight_bit_sums_wrap_around(ranks: RankPool, dtype: str, path: str) -> None:
    ranks.run(wrapping_sum, dtype, path)


# Dtypes neither the engine nor Gloo reduces.


def other_dtype_all_reduce(dtype_name: str, path: str) -> str:
    dtype = getattr(torch, dtype_name)
    tensor = (torch.arange(6) + dist.get_rank()).to(dtype)
    try:
        dist.all_reduce(tensor, group=_groups[path])
    except RuntimeError as error:
        then_still_in_step(path)
        return str(error)
    expected = sum(torch.arange(6) + r for r in range(dist.get_world_size())).to(dtype)
    assert torch.equal(tensor, expected), (tensor, expected)
    return "correct"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("dtype", "names"), [("int16", ("int16", "Short")), ("float8_e4m3fn", ("float8", "Float8"))])
def test_other_dtypes_give_a_correct_result_or_name_the_dtype(
    ranks: RankPool, dtype: str, names: tuple[str, ...], path: str
) -> None:
    for outcome in ranks.run(other_dtype_all_reduce, dtype, path):
        assert outcome == "correct" or ("fairring" in outcome and any(n in outcome for n in names)), outcome


# A view whose elements overlap (stride 0) on the engine.


def expanded_all_reduce() -> str:
    dist.all_reduce(torch.ones(4))  # makes the engine, so that the wait below is for the op alone
    tensor = torch.full((1,), float(dist.get_rank() + 1)).expand(4)
    try:
        # A bounded wait (a 4-element all-reduce takes milliseconds): the rank answers even if the op never completes.
        dist.all_reduce(tensor, async_op=True).wait(timeout=timedelta(seconds=10))
    except RuntimeError as error:
        return str(error)
    expected = sum(range(1, dist.get_world_size() + 1))
    assert torch.equal(tensor, torch.full((4,), float(expected))), tensor
    return "correct"


@pytest.mark.timeout(90)
def test_an_expanded_tensor_gives_a_result_or_a_clear_error() -> None:
    with RankPool(LAYOUT) as pool:  # its own: the op may be left pending
        outcomes = pool.run(expanded_all_reduce, timeout=40)
    for outcome in outcomes:
        assert outcome == "correct" or "overlap" in outcome or "expand" in outcome, outcome
