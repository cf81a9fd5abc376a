"""Which path an all-reduce takes (csrc/backend/allreduce_path.h), by table, without processes.

The expectation is docs/design.md's rule restated here: the engine takes an
all-reduce when the group serves it (2+ machines of equally many ranks), the
tensors are one dense tensor (or all_reduce_coalesced's, packed) of one dtype
and device, at least the flat threshold of their device type, the op is SUM,
AVG (floating point), MAX, MIN, PRODUCT, PREMUL_SUM (premultiplied, then a
SUM) or, on CPU, BAND/BOR/BXOR of integers, the dtype float32/64, float16, bfloat16, int8, uint8, int32 or int64,
and, for CUDA tensors, the CUDA engine is on; never while the caller's stream
is captured into a CUDA graph (NCCL then runs it, whatever its size). What the engine could take but
is below the threshold goes to the delegate counted as such. A PREMUL_SUM of
all_reduce is premultiplied here on CPU, on the engine, and where NCCL would
misread a bfloat16 factor outside a native coalescing block.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from fairring import _C

MiB = 1 << 20
THRESHOLDS = {"cpu": 256 * 1024, "cuda": 4 * MiB}
ENGINE_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32}
ENGINE_DTYPES |= {torch.int64}
FLOATING = {torch.float32, torch.float64, torch.float16, torch.bfloat16}
ENGINE_OPS = {"sum", "max", "min", "product"}
BITWISE_OPS = {"band", "bor", "bxor"}


def config(cuda_engine: bool) -> _C.Config:
    # fairring._config.Config's attributes, with a threshold of each device's own (no setting gives that).
    settings = SimpleNamespace(total_memory=50 * MiB, slice_size=4 * MiB, slices_in_flight=4, min_shard=256 * 1024)
    settings.__dict__.update(cpu_flat_threshold=THRESHOLDS["cpu"], cuda_flat_threshold=THRESHOLDS["cuda"])
    settings.__dict__.update(cuda_engine_in_use=cuda_engine, high_priority_streams=False, timeline_directory=None)
    settings.__dict__.update(cuda_wait="host")
    return _C.Config.from_settings(settings)


def expected(case: dict[str, object]) -> tuple[str, bool]:
    """The documented rule, written apart from the code under test."""
    device, dtype, op = case["device"], case["dtype"], case["op"]
    premul = op == "premul_sum"
    reduced = "sum" if premul and not case["coalesced"] else op
    op_ok = reduced in ENGINE_OPS or (reduced == "avg" and dtype in FLOATING)
    op_ok = op_ok or (reduced in BITWISE_OPS and device == "cpu" and dtype in ENGINE_DTYPES - FLOATING)
    engine_can = case["serves_engine"] and case["uniform"] and not case["captured"] and dtype in ENGINE_DTYPES and op_ok
    if engine_can and case["bytes"] < THRESHOLDS[device]:
        path = "delegate below threshold"
    elif engine_can and (device == "cpu" or case["cuda_engine"]) and (case["count"] == 1 or case["coalesced"]):
        path = "engine"
    else:
        path = "delegate"
    misread = case["nccl_misreads"] and not case["block_open"]
    premultiply = premul and not case["coalesced"] and (device == "cpu" or path == "engine" or misread)
    return path, premultiply


AXES = {
    "device": ["cpu", "cuda"],
    "dtype": [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64],
    "op": ["sum", "avg", "max", "band", "premul_sum"],
    "bytes": [4096, 1 * MiB, 64 * MiB],
    "count": [1, 3],
    "serves_engine": [True, False],
    "cuda_engine": [False, True],
    "coalesced": [False, True],
    "captured": [False, True],
}
CASES = [dict(zip(AXES, values, strict=True)) for values in itertools.product(*AXES.values())]


def decide(case: dict[str, object], **overrides: object) -> tuple[object, ...]:
    case = {"uniform": True, "nccl_misreads": False, "block_open": False, **case, **overrides}
    return _C._testing.allreduce_path(
        device=case["device"],
        dtype_of=torch.empty(0, dtype=case["dtype"]),
        op=case["op"],
        bytes=case["bytes"],
        tensor_count=case["count"],
        uniform=case["uniform"],
        coalesced=case["coalesced"],
        nccl_misreads_premul_factor=case["nccl_misreads"],
        native_block_open=case["block_open"],
        serves_engine=case["serves_engine"],
        config=config(case["cuda_engine"]),
        captured=case["captured"],
        with_reason=case.get("with_reason", False),
    )


def test_every_combination_takes_the_documented_path() -> None:
    wrong = []
    for case in CASES:
        full = {"uniform": True, "nccl_misreads": False, "block_open": False, **case}
        if decide(case) != expected(full):
            wrong.append((case, decide(case), expected(full)))
    assert not wrong, f"{len(wrong)} of {len(CASES)} cases, e.g. {wrong[:3]}"


@pytest.mark.parametrize(
    ("overrides", "path", "premultiply"),
    [
        # Tensors of several dtypes or devices, or sparse: the delegate, never counted as below the threshold.
        ({"uniform": False}, "delegate", False),
        ({"uniform": False, "bytes": 4096}, "delegate", False),
        # NCCL would zero a bfloat16 PREMUL_SUM: premultiplied here, and NCCL gets a SUM...
        ({"op": "premul_sum", "dtype": torch.bfloat16, "nccl_misreads": True}, "delegate", True),
        # ...except inside a native coalescing block, whose launch may not follow this thread's stream.
        ({"op": "premul_sum", "dtype": torch.bfloat16, "nccl_misreads": True, "block_open": True}, "delegate", False),
        # The CUDA engine on: a PREMUL_SUM on it is premultiplied; several tensors stay with NCCL, as they are.
        ({"op": "premul_sum", "cuda_engine": True}, "engine", True),
        ({"op": "premul_sum", "cuda_engine": True, "count": 3}, "delegate", False),
        # Captured into a CUDA graph: NCCL, at any size, never counted as below the threshold.
        ({"cuda_engine": True, "captured": True}, "delegate", False),
        ({"cuda_engine": True, "captured": True, "bytes": 4096}, "delegate", False),
    ],
)
def test_the_rules_that_take_a_second_look(overrides: dict[str, object], path: str, premultiply: bool) -> None:
    base = {"device": "cuda", "dtype": torch.float32, "op": "sum", "bytes": 64 * MiB, "count": 1}
    base |= {"serves_engine": True, "cuda_engine": False, "coalesced": False, "captured": False}
    assert decide(base, **overrides) == (path, premultiply)


def expected_reason(case: dict[str, object]) -> str:
    """Why, by the documented order (csrc/backend/path_reason.h): the first thing that keeps it off the engine."""
    path, _ = expected(case)
    if path == "engine":
        return "engine"
    device, dtype, op = case["device"], case["dtype"], case["op"]
    reduced = "sum" if op == "premul_sum" and not case["coalesced"] else op
    op_ok = reduced in ENGINE_OPS or (reduced == "avg" and dtype in FLOATING)
    op_ok = op_ok or (reduced in BITWISE_OPS and device == "cpu" and dtype in ENGINE_DTYPES - FLOATING)
    for reason, applies in [
        ("irregular_group", not case["serves_engine"]),
        ("captured", case["captured"]),
        ("mixed_tensors", not case["uniform"]),
        ("dtype_or_op", dtype not in ENGINE_DTYPES or not op_ok),
        ("cuda_engine_off", device == "cuda" and not case["cuda_engine"]),
        ("below_threshold", case["bytes"] < THRESHOLDS[device]),
    ]:
        if applies:
            return reason
    return "coalescing"  # several tensors, not all_reduce_coalesced's


def test_every_combination_names_the_documented_reason() -> None:
    wrong = []
    for case in CASES:
        full = {"uniform": True, "nccl_misreads": False, "block_open": False, **case}
        path, premultiply, reason = decide(full, with_reason=True)
        if (path, premultiply) != decide(full) or reason != expected_reason(full):
            wrong.append((case, reason, expected_reason(full)))
    assert not wrong, f"{len(wrong)} of {len(CASES)} cases, e.g. {wrong[:3]}"


def test_the_reference_would_catch_a_wrong_rule() -> None:
    """Negative control: a rule with the CUDA engine switch left out disagrees with the table."""
    flipped = [case for case in CASES if case["device"] == "cuda" and not case["cuda_engine"]]
    disagreements = sum(decide(case) != decide(case, cuda_engine=True) for case in flipped)
    assert disagreements > 0
