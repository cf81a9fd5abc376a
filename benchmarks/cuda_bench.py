"""One rank of the GPU check's bench; `python -m benchmarks.gpu_check` starts --world of them.

The processes share one GPU (or, with --device cpu, the CPU); their
FAIRRING_MACHINE_ID makes them machines of one rank each, so that every
all-reduce crosses the rails, or of several, whose local steps then run on
real NCCL groups: a distinct NCCL_HOSTID per process makes NCCL take every
process for its own host, and connect them over its socket transport
(docs/design.md, "One GPU, several processes"). In order, each rank runs the
phases it is given:

1. --sizes (two ranks only): times float32 all-reduces on fairring's engine,
   and the same bytes moved by fairring._C._testing.RailsEndpoint between the same two
   processes: both ranks send and receive S/2 bytes on lane 0, then S/2 on
   lane 1 ("sequential", the two network phases of the engine one after the
   other), and both halves at once ("concurrent");
2. --check-sizes: checks every dtype and reduce op at several sizes, many ops
   in flight, against plain torch on the CPU;
3. --stress-rounds: rounds of --stress-ops float32 sums of --stress-bytes each,
   all in flight at once, each result checked exactly on the device;
4. --order-checks: an engine all-reduce followed, without a wait, by a broadcast
   of the same tensor (which the delegate runs), and an all-reduce whose
   is_completed() is polled and whose tensor is read, without wait(), once it
   says True: both against torch;
5. --kill-rank R (last): every rank all-reduces 4 MiB and broadcasts 16 KiB (the
   delegate's) in a stream; rank R kills itself (SIGKILL) after a few, and each
   survivor records its first error, how long after the kill it came, whether its
   device then drained (the delegate's kernels ended) within the op timeout, and
   how long destroying the group then took;
6. --compare-sizes: side by side in these processes, on the same tensors, the
   order alternated each round: fairring's all-reduce, NCCL's (a NCCL group
   of every rank; --device cuda) and, with --compare-gloo, Gloo's; every
   result checked.

The barriers and the slowest-rank reductions run on a Gloo group of CPU
tensors, so that the timings include no other collective.
Results go to <out>/rank<r>.json, rewritten after each phase, so what was
measured survives a later crash or hang.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import fairring
from fairring.bench.turns import time_in_turns

DEFAULT_WORLD = 2
# Int8 sums of values in [0, 20] and products of values in {1, 2} stay exact up to this many ranks.
MAX_WORLD = 6
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int8, torch.uint8, torch.int32, torch.int64)
ARITHMETIC_OPS = ("sum", "max", "min", "product")
STORE_PREFIX = "fairring-gpu-check/rails-reference"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_cases(device_type: str) -> list[tuple[torch.dtype, str]]:
    """(dtype, op) pairs to check: every op the engine runs, on every dtype it takes."""
    cases = [(dtype, op) for dtype in (*FLOAT_DTYPES, *INT_DTYPES) for op in ARITHMETIC_OPS]
    cases += [(dtype, "avg") for dtype in FLOAT_DTYPES]
    cases += [(dtype, "premul_sum") for dtype in FLOAT_DTYPES]
    return cases


def premul_factor(rank: int) -> float:
    return float(rank + 1)


def reduce_op(op: str, rank: int) -> Any:
    if op == "premul_sum":
        return dist._make_nccl_premul_sum(premul_factor(rank))
    return {
        "sum": dist.ReduceOp.SUM,
        "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT,
        "avg": dist.ReduceOp.AVG,
    }[op]


def draw(rank: int, numel: int, seed: int, low: int, high: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed * 256 + rank)
    return torch.randint(low, high + 1, (numel,), generator=generator, dtype=torch.int64)


def rank_input(rank: int, world: int, numel: int, dtype: torch.dtype, seed: int, op: str) -> torch.Tensor:
    """Rank `rank`'s input on the CPU, the same wherever it is computed.

    Every value, and every result of reducing `world` of them, is exactly
    representable in `dtype` (even bfloat16, 8 significant bits), so results
    must match exactly: products multiply values in {1, 2}; ints are in
    [0, 20], so sums fit int8; floats are quarters k/4 with |k| at most 32, less
    where premul_sum's weights (1 + rank) could sum them past 256 quarters; for
    avg the last rank's values make each sum a multiple of `world`, so that it
    divides exactly (3 ranks included).
    """
    if op == "product":
        return draw(rank, numel, seed, 1, 2).to(dtype)
    if not dtype.is_floating_point:
        return draw(rank, numel, seed, 0, 20).to(dtype)
    limit = min(32, 256 // (world * (world + 1) // 2))
    quarters = draw(rank, numel, seed, -limit, limit)
    if op == "avg" and rank == world - 1:
        others = sum(draw(other, numel, seed, -limit, limit) for other in range(rank))
        quarters -= (others + quarters) % world
    return (quarters.to(torch.float64) / 4).to(dtype)


def expected_result(world: int, numel: int, dtype: torch.dtype, seed: int, op: str) -> torch.Tensor:
    """The all-reduce of every rank's rank_input, computed in float64 or int64."""
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    inputs = torch.stack([rank_input(r, world, numel, dtype, seed, op).to(wide) for r in range(world)])
    if op in ("sum", "avg"):
        result = inputs.sum(0)
        if op == "avg":
            result = result / world
    elif op == "premul_sum":
        factors = torch.tensor([premul_factor(r) for r in range(world)], dtype=wide).unsqueeze(1)
        result = (inputs * factors).sum(0)
    elif op == "product":
        result = inputs.prod(0)
    elif op == "max":
        result = inputs.max(0).values
    elif op == "min":
        result = inputs.min(0).values
    else:
        raise ValueError(f"unknown op {op!r}")
    return result.to(dtype)


def stress_pattern(numel: int, seed: int, device: torch.device) -> torch.Tensor:
    """Integers in [-128, 128] as float32, made on the device; rank r sends the pattern plus r.

    Sums of up to MAX_WORLD ranks' are exact. The period, 257 elements, divides
    no slice or shard, so data landing at another offset, or from another
    all-reduce (seed), is wrong.
    """
    values = torch.arange(numel, dtype=torch.int32, device=device).remainder_(257)
    return values.mul_(7).add_(seed * 31 % 257).remainder_(257).to(torch.float32).sub_(128)


def compare(actual: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
    """Exact comparison (see rank_input); on a mismatch, how many elements and where."""
    if actual.dtype == expected.dtype and actual.shape == expected.shape and torch.equal(actual, expected):
        return {"ok": True}
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return {"ok": False, "error": f"got {actual.dtype} {tuple(actual.shape)}, expected {expected.dtype}"}
    wrong = actual != expected
    difference = (actual.to(torch.float64) - expected.to(torch.float64)).abs()
    return {
        "ok": False,
        "mismatches": int(wrong.sum()),
        "first_bad_index": int(wrong.nonzero()[0, 0]),
        "max_abs_error": float(difference.max()),
    }


class Results:
    """This rank's results, rewritten atomically after each phase."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data
        self.data.setdefault("errors", [])

    def error(self, where: str) -> None:
        self.data["errors"].append({"where": where, "traceback": traceback.format_exc()})
        print(f"rank {self.data['rank']}: {where} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)

    def save(self) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.data, indent=1))
        partial.replace(self.path)


class Bench:
    """The process group, the Gloo group that coordinates, and the rails reference endpoint."""

    def __init__(self, args: argparse.Namespace, results: Results) -> None:
        self.args = args
        self.results = results
        self.rank: int = args.rank
        self.world: int = args.world
        self.timeout = timedelta(seconds=args.op_timeout)
        self.device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.store = dist.TCPStore(
            "127.0.0.1", args.port, world_size=self.world, is_master=self.rank == 0, timeout=self.timeout
        )
        dist.init_process_group(
            "fairring",
            store=self.store,
            rank=self.rank,
            world_size=self.world,
            timeout=self.timeout,
            **(nccl_job_arguments(self.device) if args.as_nccl_job else {}),
        )
        self.gloo = dist.new_group(backend="gloo", timeout=self.timeout)
        # NCCL's own all-reduce over the same processes, the baseline of --compare-sizes.
        wants_nccl = bool(args.compare_sizes) and self.device.type == "cuda"
        self.nccl = dist.new_group(backend="nccl", timeout=self.timeout) if wants_nccl else None
        self.endpoint: Any = None
        self.closed = False  # the group was destroyed already (--kill-rank)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        dist.barrier(group=self.gloo)

    def slowest(self, seconds: list[float]) -> list[float]:
        """Per iteration, the slowest rank's time: an exchange is as slow as its slower end."""
        times = torch.tensor(seconds, dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=self.gloo)
        return times.tolist()

    def timed(
        self, prepare: Callable[[], None], step: Callable[[int], None], check: Callable[[], bool]
    ) -> tuple[list[float], bool]:
        """Seconds from a barrier to the end of step(i) on the device, per timed iteration; all checks passed."""
        seconds, correct = [], True
        for iteration in range(self.args.warmup + self.args.iters):
            prepare()
            self.sync()
            self.barrier()
            start = time.perf_counter()
            step(iteration)
            self.sync()
            elapsed = time.perf_counter() - start
            correct = check() and correct
            if iteration >= self.args.warmup:
                seconds.append(elapsed)
        return self.slowest(seconds), correct

    def engine_all_reduce(self, nbytes: int) -> dict[str, Any]:
        tensor = torch.empty(nbytes // 4, dtype=torch.float32, device=self.device)
        expected = float(sum(r + 1 for r in range(self.world)))

        def step(_: int) -> None:
            dist.all_reduce(tensor, async_op=True).wait(self.timeout)

        seconds, correct = self.timed(
            lambda: tensor.fill_(self.rank + 1), step, lambda: bool(torch.all(tensor == expected))
        )
        return summary(seconds, correct)

    def open_endpoint(self) -> None:
        self.endpoint = fairring._C._testing.RailsEndpoint(
            self.store,
            STORE_PREFIX,
            self.rank,
            [[r] for r in range(self.world)],
            self.device,
            timeout=self.timeout,
        )
        self.results.data["reference_endpoint"] = self.endpoint.describe()

    def rails_reference(self, nbytes: int, concurrent: bool) -> dict[str, Any]:
        """The engine's bytes over the bare rails: S/2 each way on lane 0, then S/2 on lane 1."""
        peer = 1 - self.rank  # parse_args allows --sizes with two ranks only
        numel = nbytes // 4
        outgoing = torch.full((numel,), float(self.rank + 1), dtype=torch.float32, device=self.device)
        incoming = torch.empty(numel, dtype=torch.float32, device=self.device)
        halves = [(0, slice(0, numel // 2)), (1, slice(numel // 2, numel))]
        label = f"{'concurrent' if concurrent else 'sequential'}-{nbytes}"

        def step(iteration: int) -> None:
            pending = []
            for lane, part in halves:
                tag = f"{label}-{iteration}-lane{lane}"
                pending.append(self.endpoint.expect(peer, lane, tag, incoming[part]))
                pending.append(self.endpoint.send(peer, lane, tag, outgoing[part]))
                if not concurrent:
                    wait_all(pending, self.args.op_timeout)
                    pending = []
            wait_all(pending, self.args.op_timeout)

        seconds, correct = self.timed(
            lambda: incoming.zero_(), step, lambda: bool(torch.all(incoming == float(peer + 1)))
        )
        return summary(seconds, correct)

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
        if not self.closed:
            dist.destroy_process_group()


def nccl_job_arguments(device: torch.device) -> dict[str, Any]:
    """What a job set up for NCCL passes init_process_group: its options (high-priority streams, an
    NCCL config field) and, on CUDA, its device, which connects the NCCL delegate at init."""
    options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
    options.config.max_ctas = 16
    arguments: dict[str, Any] = {"pg_options": options}
    if device.type == "cuda":
        arguments["device_id"] = device
    return arguments


def wait_all(transfers: list[Any], timeout: float) -> None:
    for transfer in transfers:
        transfer.wait(timeout)


def summary(seconds: list[float], correct: bool) -> dict[str, Any]:
    return {"seconds": seconds, "median_s": statistics.median(seconds), "min_s": min(seconds), "correct": correct}


def run_throughput(bench: Bench, results: Results) -> None:
    rows: list[dict[str, Any]] = []
    results.data["throughput"] = rows
    try:
        bench.open_endpoint()
    except Exception:
        results.error("rails reference: RailsEndpoint")
    for nbytes in bench.args.sizes:
        row: dict[str, Any] = {"bytes": nbytes, "iters": bench.args.iters, "warmup": bench.args.warmup}
        rows.append(row)
        try:
            engine = bench.engine_all_reduce(nbytes)
            algbw = nbytes / engine["median_s"] / 1e9
            row.update(engine=engine, algbw_GBps=algbw, busbw_GBps=algbw * 2 * (bench.world - 1) / bench.world)
        except Exception:
            results.error(f"engine all_reduce of {nbytes} bytes")
        for variant in ("sequential", "concurrent"):
            if bench.endpoint is None:
                continue
            try:
                reference = bench.rails_reference(nbytes, concurrent=variant == "concurrent")
                row[f"reference_{variant}"] = reference
                if "engine" in row:
                    row[f"fraction_of_{variant}"] = reference["median_s"] / row["engine"]["median_s"]
            except Exception:
                results.error(f"rails reference ({variant}) of {nbytes} bytes")
        if bench.rank == 0:
            print(f"throughput: {json.dumps({k: v for k, v in row.items() if not isinstance(v, dict)})}", flush=True)
        results.save()


def run_correctness(bench: Bench, results: Results) -> None:
    cases = check_cases(bench.device.type)
    # Sizes that split evenly over the machines first: a tail takes the flat path, which is riskier here.
    sizes = sorted(bench.args.check_sizes, key=lambda numel: (numel % bench.world != 0, numel))
    checked: list[dict[str, Any]] = []
    results.data["correctness"] = {"planned": len(cases) * len(sizes), "cases": checked}
    for numel in sizes:
        bench.barrier()
        issued: list[tuple[dict[str, Any], torch.Tensor, Any, torch.Tensor]] = []
        # Every case of this size in flight at once, then each waited for and checked.
        for seed, (dtype, op) in enumerate(cases):
            case: dict[str, Any] = {"dtype": dtype_name(dtype), "op": op, "numel": numel, "ok": False}
            checked.append(case)
            tensor = rank_input(bench.rank, bench.world, numel, dtype, seed, op).to(bench.device)
            try:
                work = dist.all_reduce(tensor, op=reduce_op(op, bench.rank), async_op=True)
            except Exception as error:
                case["error"] = f"all_reduce raised: {error}"
                continue
            issued.append((case, tensor, work, expected_result(bench.world, numel, dtype, seed, op)))
        for case, tensor, work, expected in issued:
            try:
                work.wait(bench.timeout)
                case.update(compare(tensor.cpu(), expected))
            except Exception as error:
                case["error"] = f"wait raised: {error}"
        failed = sum(1 for case in checked[-len(cases) :] if not case["ok"])
        if bench.rank == 0:
            print(f"correctness: {numel} elements: {len(cases) - failed}/{len(cases)} cases passed", flush=True)
        results.save()


def run_stress(bench: Bench, results: Results) -> None:
    """Rounds of --stress-ops all-reduces in flight at once, each checked exactly, on the device."""
    args, device = bench.args, bench.device
    numel = args.stress_bytes // 4
    rounds: list[dict[str, Any]] = []
    checked: list[dict[str, Any]] = []
    results.data["stress"] = {"ops": args.stress_ops, "bytes": args.stress_bytes, "rounds": rounds, "cases": checked}
    for round_index in range(args.stress_rounds):
        seeds = [round_index * args.stress_ops + index for index in range(args.stress_ops)]
        patterns = [stress_pattern(numel, seed, device) for seed in seeds]
        tensors = [pattern + bench.rank for pattern in patterns]
        bench.sync()
        bench.barrier()
        # Where a rank's output stops tells which round and step hung, if one did.
        print(f"rank {bench.rank}: stress round {round_index}: issuing {len(seeds)} all-reduces", flush=True)
        start = time.perf_counter()
        works = [dist.all_reduce(tensor, async_op=True) for tensor in tensors]
        for work in works:
            work.wait(bench.timeout)
        bench.sync()
        seconds = time.perf_counter() - start
        rank_sum = bench.world * (bench.world - 1) // 2
        for seed, pattern, tensor in zip(seeds, patterns, tensors, strict=True):
            expected = pattern.mul_(bench.world).add_(rank_sum)
            checked.append({"round": round_index, "seed": seed, **compare(tensor, expected)})
        wrong = sum(1 for case in checked[-len(seeds) :] if not case["ok"])
        rounds.append({"round": round_index, "seconds": seconds, "wrong": wrong})
        print(f"rank {bench.rank}: stress round {round_index}: {wrong} wrong, {seconds:.3f} s", flush=True)
        results.save()


# The order checks' tensors: on a GPU 16 MiB of float32, the engine's at every flat threshold up to
# that; on the CPU (the check's smoke mode, every rank on a few cores) 256 KiB.
ORDER_NUMEL = {"cuda": 1 << 22, "cpu": 1 << 16}


def run_order_checks(bench: Bench, results: Results) -> None:
    """Collectives on the same memory follow each other; is_completed() means done on the device."""
    numel = ORDER_NUMEL[bench.device.type]
    checks: dict[str, Any] = {}
    results.data["order"] = checks
    expected = expected_result(bench.world, numel, torch.float32, 7, "sum")
    tensor = rank_input(bench.rank, bench.world, numel, torch.float32, 7, "sum").to(bench.device)
    bench.barrier()
    reduced = dist.all_reduce(tensor, async_op=True)
    broadcast = dist.broadcast(tensor, src=0, async_op=True)  # must broadcast the reduced tensor
    reduced.wait(bench.timeout)
    broadcast.wait(bench.timeout)
    checks["all_reduce_then_broadcast"] = compare(tensor.cpu(), expected)
    tensor = rank_input(bench.rank, bench.world, numel, torch.float32, 8, "sum").to(bench.device)
    bench.sync()
    bench.barrier()
    work = dist.all_reduce(tensor, async_op=True)
    deadline = time.monotonic() + bench.args.op_timeout
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.0005)
    # Read on the current stream without wait(): right only if "completed" meant done on the device.
    expected = expected_result(bench.world, numel, torch.float32, 8, "sum")
    checks["is_completed_means_done"] = compare(tensor.cpu(), expected)
    work.wait(bench.timeout)
    results.save()
    order_checks_of_issue(bench, checks)
    results.save()


def order_checks_of_issue(bench: Bench, checks: dict[str, Any]) -> None:
    """The same tensor twice in flight, a coalescing block, and two groups at once from two threads."""
    numel = ORDER_NUMEL[bench.device.type] // 2
    single = expected_result(bench.world, numel, torch.float32, 9, "sum")
    tensor = rank_input(bench.rank, bench.world, numel, torch.float32, 9, "sum").to(bench.device)
    bench.barrier()
    works = [dist.all_reduce(tensor, async_op=True) for _ in range(2)]  # the second reduces the first's result
    for work in works:
        work.wait(bench.timeout)
    checks["same_tensor_back_to_back"] = compare(tensor.cpu(), single * bench.world)
    tensors = [
        rank_input(bench.rank, bench.world, numel, torch.float32, 10 + i, "sum").to(bench.device) for i in range(3)
    ]
    bench.barrier()
    with dist._coalescing_manager(device=bench.device, async_ops=True) as block:
        for coalesced in tensors:
            dist.all_reduce(coalesced)
    block.wait()
    checks["coalesced"] = compare(
        torch.cat([t.cpu() for t in tensors]),
        torch.cat([expected_result(bench.world, numel, torch.float32, 10 + i, "sum") for i in range(3)]),
    )
    if bench.device.type == "cuda" and os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        # Two engines' launches interleave by timing: on a GPU in launch order, NCCL's rule for
        # several communicators makes that the user's to avoid (docs/design.md, "What stays the user's").
        return
    checks["two_groups_two_threads"] = two_groups_at_once(bench)


def two_groups_at_once(bench: Bench) -> dict[str, Any]:
    """The world group from this thread and a second fairring group from another, both in flight."""
    second = dist.new_group(backend="fairring", timeout=bench.timeout)
    for group in (None, second):  # each engine made from one thread, in one order
        dist.all_reduce(torch.ones(8, device=bench.device), group=group)
    outcomes: dict[str, dict[str, Any]] = {}
    numel = ORDER_NUMEL[bench.device.type] // 4

    def stream(name: str, group: Any, seed: int) -> None:
        if bench.device.type == "cuda":
            torch.cuda.set_device(bench.device)
        try:
            pending = []
            for index in range(12):
                case = seed + index
                tensor = rank_input(bench.rank, bench.world, numel, torch.float32, case, "sum").to(bench.device)
                pending.append((dist.all_reduce(tensor, group=group, async_op=True), tensor, case))
                if len(pending) == 3 or index == 11:
                    for work, done, checked in pending:
                        work.wait(bench.timeout)
                        result = compare(done.cpu(), expected_result(bench.world, numel, torch.float32, checked, "sum"))
                        if not result["ok"]:
                            outcomes[name] = result
                            return
                    pending = []
            outcomes[name] = {"ok": True}
        except Exception as error:
            outcomes[name] = {"ok": False, "error": str(error)}

    other = threading.Thread(target=stream, args=("second", second, 2000))
    other.start()
    stream("world", None, 1000)
    other.join()
    dist.destroy_process_group(second)
    failed = {name: outcome for name, outcome in outcomes.items() if not outcome["ok"]}
    return {"ok": len(outcomes) == 2 and not failed, **({"failed": failed} if failed else {})}


def run_kill(bench: Bench, results: Results) -> None:
    """A rank killed mid-stream: every survivor's first error names it, in time, and teardown returns."""
    victim, fault = bench.args.kill_rank, bench.args.out / "fault"
    outcome: dict[str, Any] = {"victim": victim}
    results.data["failure"] = outcome
    tensor = torch.ones(1 << 20, device=bench.device)
    side = torch.ones(4096, device=bench.device)  # the delegate's traffic beside the engine's
    for _ in range(3):  # the engine made and every path warm
        dist.all_reduce(tensor)
        dist.broadcast(side, src=0)
    bench.sync()
    bench.barrier()
    if bench.rank == victim:
        fault.write_text(str(time.time()))
        results.data["done"] = True
        results.save()
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    try:
        while time.monotonic() - started < 4 * bench.args.op_timeout:
            works = [dist.all_reduce(tensor, async_op=True), dist.broadcast(side, src=0, async_op=True)]
            for work in works:
                work.wait()
            bench.sync()
        outcome["first"] = f"no error in {4 * bench.args.op_timeout:.0f} s"
    except Exception as error:  # what the survivor sees is the result
        outcome["first"] = str(error)
    failed_at = time.time()
    with contextlib.suppress(OSError, ValueError):
        outcome["seconds"] = failed_at - float(fault.read_text())
    outcome["names_victim"] = f"rank {victim}" in outcome["first"]
    # The delegate's kernels in flight (a broadcast that needs the dead rank) end with the engine's
    # failure, which aborts the delegate, not at NCCL's own watchdog minutes later: the device drains.
    drained = threading.Event()
    threading.Thread(target=lambda: (bench.sync(), drained.set()), daemon=True).start()
    outcome["device_drained"] = drained.wait(timeout=bench.args.op_timeout)
    outcome["drain_seconds"] = time.time() - failed_at
    results.save()
    # A later collective of the failed group, one the delegate (NCCL on CUDA) would run: refused at once.
    refusing = time.monotonic()
    try:
        dist.broadcast(tensor, src=0)
        bench.sync()
        outcome["later_broadcast"] = "completed"
    except Exception as error:
        outcome["later_broadcast"] = str(error)
    outcome["later_broadcast_seconds"] = time.monotonic() - refusing
    results.save()
    destroying = time.monotonic()
    try:
        dist.destroy_process_group()
    except Exception as error:
        outcome["destroy_error"] = str(error)
    outcome["destroy_seconds"] = time.monotonic() - destroying
    bench.closed = True
    results.save()


def run_compare(bench: Bench, results: Results) -> None:
    """fairring, NCCL and Gloo on the same tensors, rounds alternating their order."""
    contenders: list[tuple[str, Any]] = [("fairring", None)]
    if bench.nccl is not None:
        contenders.append(("nccl", bench.nccl))
    if bench.args.compare_gloo:
        contenders.append(("gloo", bench.gloo))
    rows: list[dict[str, Any]] = []
    results.data["compare"] = {"contenders": [name for name, _ in contenders], "rows": rows}
    for nbytes in bench.args.compare_sizes:
        row = compare_at(bench, dict(contenders), nbytes)
        rows.append(row)
        if bench.rank == 0:
            medians = {name: round(row[name]["median_s"] * 1e3, 3) for name, _ in contenders}
            print(f"compare: {nbytes} bytes: median ms {json.dumps(medians)}", flush=True)
        results.save()


def compare_at(bench: Bench, groups: dict[str, Any], nbytes: int) -> dict[str, Any]:
    """One row of run_compare: each group's all-reduce of `nbytes`, timed in turns (fairring.bench.turns)."""
    tensor = torch.empty(nbytes // 4, dtype=torch.float32, device=bench.device)
    expected = float(sum(r + 1 for r in range(bench.world)))
    correct = {name: True for name in groups}

    def check(name: str) -> None:
        correct[name] = correct[name] and bool(torch.all(tensor == expected))

    seconds = time_in_turns(
        list(groups),
        warmup=bench.args.warmup,
        iters=bench.args.iters,
        fill=lambda _: tensor.fill_(bench.rank + 1),
        run=lambda name: dist.all_reduce(tensor, group=groups[name], async_op=True).wait(bench.timeout),
        check=check,
        sync=bench.sync,
        barrier=bench.barrier,
    )
    row: dict[str, Any] = {"bytes": nbytes}
    for name in groups:
        row[name] = summary(bench.slowest(seconds[name]), correct[name])
    return row


def engine_counters(bench: Bench, results: Results) -> None:
    backend = dist.group.WORLD._get_backend(bench.device)
    results.data["engine_stats"] = backend.engine_stats(bench.device.type)
    with contextlib.suppress(Exception):
        rails = backend.rails(bench.device.type)
        results.data["engine_rails"] = None if rails is None else rails["description"]


def device_info(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {}
    properties = torch.cuda.get_device_properties(device)
    return {
        "name": torch.cuda.get_device_name(device),
        "count": torch.cuda.device_count(),
        "capability": ".".join(str(v) for v in torch.cuda.get_device_capability(device)),
        "memory_GiB": round(properties.total_memory / 2**30, 1),
    }


def die_with_parent() -> None:
    """Linux: the kernel kills this rank when the check that started it dies."""
    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cuda_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=DEFAULT_WORLD, help=f"ranks, 2 to {MAX_WORLD} (default 2)")
    parser.add_argument("--port", type=int, required=True, help="the TCPStore's port (rank 0 serves it)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--sizes", default="", help="throughput: comma-separated byte counts (multiples of 8)")
    parser.add_argument("--check-sizes", default="", help="correctness: comma-separated element counts")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--stress-ops", type=int, default=4, help="stress: all-reduces in flight at once")
    parser.add_argument("--stress-bytes", type=int, default=0, help="stress: bytes of each (a multiple of 4)")
    parser.add_argument("--stress-rounds", type=int, default=0, help="stress: rounds (0: no stress)")
    parser.add_argument("--order-checks", action="store_true", help="same memory, then is_completed()")
    parser.add_argument("--kill-rank", type=int, help="last phase: this rank kills itself mid-stream")
    parser.add_argument(
        "--as-nccl-job", action="store_true", help="init with an NCCL job's pg_options and, on CUDA, device_id"
    )
    parser.add_argument("--compare-sizes", default="", help="side by side with NCCL: byte counts (multiples of 4)")
    parser.add_argument("--compare-gloo", action="store_true", help="--compare-sizes includes Gloo")
    parser.add_argument("--op-timeout", type=float, default=60.0, help="seconds any one wait may take")
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<r>.json")
    args = parser.parse_args(argv)
    args.sizes = [int(size) for size in args.sizes.split(",") if size]
    args.check_sizes = [int(numel) for numel in args.check_sizes.split(",") if numel]
    args.compare_sizes = [int(size) for size in args.compare_sizes.split(",") if size]
    if any(size <= 0 or size % 4 for size in args.compare_sizes):
        parser.error("--compare-sizes must be positive multiples of 4 bytes")
    if not 2 <= args.world <= MAX_WORLD or not 0 <= args.rank < args.world:
        parser.error(f"--world must be 2 to {MAX_WORLD} and --rank 0 to --world - 1")
    if args.sizes and args.world != 2:
        parser.error("--sizes needs --world 2: the rails reference pairs two machines")
    if args.iters < 1 or args.warmup < 0 or any(size <= 0 or size % 8 for size in args.sizes):
        parser.error("--iters must be >= 1, --warmup >= 0, and --sizes positive multiples of 8 bytes")
    if any(numel < 1 for numel in args.check_sizes):
        parser.error("--check-sizes must be positive")
    if args.kill_rank is not None and not 0 <= args.kill_rank < args.world:
        parser.error("--kill-rank must name a rank")
    if args.stress_rounds and (args.stress_ops < 1 or args.stress_bytes <= 0 or args.stress_bytes % 4):
        parser.error("--stress-rounds needs --stress-ops >= 1 and --stress-bytes a positive multiple of 4")
    return args


def main(argv: list[str]) -> int:
    die_with_parent()
    args = parse_args(argv)
    results = Results(
        args.out / f"rank{args.rank}.json",
        {
            "rank": args.rank,
            "world": args.world,
            "device": args.device,
            "pid": os.getpid(),
            "done": False,
            "build": fairring.build_info(),
        },
    )
    try:
        bench = Bench(args, results)
        results.data["gpu"] = device_info(bench.device)
    except Exception:
        results.error("init_process_group")
        results.save()
        return 1
    results.save()
    phases = [
        ("throughput", run_throughput, bool(args.sizes)),
        ("correctness", run_correctness, bool(args.check_sizes)),
        ("stress", run_stress, args.stress_rounds > 0),
        ("order", run_order_checks, args.order_checks),
        ("compare", run_compare, bool(args.compare_sizes)),
        ("engine", engine_counters, True),
        ("failure", run_kill, args.kill_rank is not None),  # destroys the group
    ]
    for name, phase, wanted in phases:
        if not wanted:
            continue
        try:
            phase(bench, results)
        except Exception:
            results.error(name)
        results.save()
    results.data["done"] = True
    results.save()
    (args.out / f"rank{args.rank}.finished").touch()  # the check allows teardown a short while from now
    try:
        bench.close()
    except Exception:
        results.error("teardown")
        results.save()
    return 1 if results.data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
