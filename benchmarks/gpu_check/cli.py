"""The command line: its flags, and their defaults by --device and --quick."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import gpu_check
from benchmarks.cuda_bench import MAX_WORLD
from fairring._config import ConfigError
from fairring._sizes import parse_size

from .budget import WORLD_LIMIT_PER_PROCESS_S

# The stages' short names, for --only, in the order they run.
STAGE_KEYS = (
    "contract",
    "fsdp2",
    "versus",
    "tests",
    "worlds",
    "compare",
    "failure",
    "bench",
    "training",
    "stress",
    "validate",
    "nixl",
)

# The package's docstring: the stages, in order, and the time rule.
HELP = gpu_check.__doc__ or ""

DEFAULT_SIZES = {"cuda": "1MiB,4MiB,16MiB,64MiB,256MiB", "cpu": "1MiB,4MiB,16MiB"}
QUICK_SIZES = {"cuda": "1MiB,16MiB,64MiB", "cpu": "64KiB,1MiB"}
DEFAULT_COMPARE_SIZES = {"cuda": "1MiB,4MiB,16MiB,64MiB,256MiB", "cpu": "64KiB,1MiB,4MiB"}
QUICK_COMPARE_SIZES = {"cuda": "1MiB,16MiB,64MiB", "cpu": "64KiB,1MiB"}
DEFAULT_CHECK_SIZES = "1,1000,65537,1000003"
QUICK_CHECK_SIZES = "1,1000,65537"
# Large enough that one shard (half a slice, on two machines) fills cuda_basic's 16 MiB send
# pool, and the shards of the slices in flight exceed it; each all-reduce is 8 slices of the
# full size. The CPU smoke mode keeps that shape at an eighth of the bytes.
STRESS_SLICE = {"cuda": "32MiB", "cpu": "4MiB"}
STRESS_BYTES = {"cuda": "256MiB", "cpu": "32MiB"}


def parse_layout(spec: str) -> tuple[int, int]:
    """ "4" (4 machines of one rank) or "2x2" (2 machines of 2 ranks): (machines, ranks per machine)."""
    machines, _, local = spec.strip().partition("x")
    return int(machines), int(local or 1)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=HELP.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=HELP.split("\n\n", 1)[1],
    )
    parser.add_argument("--report", type=Path, default=Path("gpu-check-report.md"), help="the report (Markdown)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke mode on CPU tensors")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and iterations")
    parser.add_argument("--sizes", help="throughput sizes, e.g. 1MiB,4MiB (default by --device and --quick)")
    parser.add_argument("--check-sizes", help=f"correctness sizes in elements (default {DEFAULT_CHECK_SIZES})")
    parser.add_argument("-n", "--iters", type=int, help="timed iterations per size (default 10, quick 3)")
    parser.add_argument("-w", "--warmup", type=int, help="untimed iterations first (default 3, quick 1)")
    parser.add_argument("--tests", choices=("auto", "run", "skip"), default="auto", help="auto: run with --device cuda")
    parser.add_argument("--tests-timeout", type=float, default=300.0, help="seconds for the tests (default 300)")
    parser.add_argument(
        "--contract-timeout", type=float, default=120.0, help="seconds for the contract stage (default 120)"
    )
    parser.add_argument("--bench-timeout", type=float, default=240.0, help="seconds for the bench (default 240)")
    parser.add_argument(
        "--worlds",
        default="2x2,3x2",
        help="layouts of the correctness stages: N (N machines of one rank) or MxL (default 2x2,3x2)",
    )
    parser.add_argument("--compare", default="2x2,2x1", help="layouts of the compare stages, MxL ('' for none)")
    parser.add_argument("--compare-sizes", help="compare sizes (default 1MiB,...,256MiB; cpu 64KiB,1MiB)")
    parser.add_argument("--compare-timeout", type=float, default=150.0, help="seconds for the comparison")
    parser.add_argument("--failure-timeout", type=float, default=90.0, help="seconds for the failure stage")
    parser.add_argument("--training-timeout", type=float, default=150.0, help="seconds for the training stage")
    parser.add_argument("--fsdp2-timeout", type=float, default=360.0, help="seconds for the FSDP2 stage")
    parser.add_argument(
        "--versus-timeout", type=float, default=720.0, help="seconds for the stage against NCCL (default 720)"
    )
    parser.add_argument(
        "--worlds-timeout", type=float, help=f"seconds for each (default {WORLD_LIMIT_PER_PROCESS_S:.0f} per process)"
    )
    parser.add_argument("--stress-slice", help="stress: FAIRRING_SLICE_SIZE (default 32MiB, cpu 4MiB)")
    parser.add_argument("--stress-bytes", help="stress: bytes of each all-reduce (default 256MiB, cpu 32MiB)")
    parser.add_argument("--stress-ops", type=int, default=4, help="stress: all-reduces in flight at once (default 4)")
    parser.add_argument("--stress-rounds", type=int, default=4, help="stress: rounds (default 4; 0: no stress)")
    parser.add_argument("--stress-timeout", type=float, default=120.0, help="seconds for the stress (default 120)")
    parser.add_argument("--nixl-timeout", type=float, default=120.0, help="seconds for the NIXL stage (default 120)")
    parser.add_argument("--validate-timeout", type=float, default=150.0, help="seconds for the validate stage")
    parser.add_argument("--op-timeout", type=float, default=60.0, help="seconds any one wait in the bench may take")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for every stage together (default 540)")
    parser.add_argument(
        "--only",
        default="",
        help=f"run only these stages, the others reported skipped: any of {','.join(STAGE_KEYS)} (default: all)",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="VAR=VALUE", help="environment for every stage's ranks"
    )
    parser.add_argument("--build-log", type=Path, help="the build's output, for the report (make gpu-check)")
    parser.add_argument("--build-seconds", type=float, help="how long the build took (make gpu-check)")
    parser.add_argument("--build-command", default="", help="the build's command line (make gpu-check)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.iters = args.iters if args.iters is not None else 3 if quick else 10
    args.warmup = args.warmup if args.warmup is not None else 1 if quick else 3
    args.compare_iters = 3 if quick else 5
    sizes = args.sizes or (QUICK_SIZES if quick else DEFAULT_SIZES)[args.device]
    check_sizes = args.check_sizes or (QUICK_CHECK_SIZES if quick else DEFAULT_CHECK_SIZES)
    try:
        args.size_list = [parse_size("--sizes", text.strip()) for text in sizes.split(",")]
        args.check_size_list = [int(text.strip()) for text in check_sizes.split(",")]
        args.world_list = [text.strip() for text in args.worlds.split(",") if text.strip()]
        args.compare_list = [text.strip() for text in args.compare.split(",") if text.strip()]
        layouts = [parse_layout(spec) for spec in [*args.world_list, *args.compare_list]]
        compare_sizes = args.compare_sizes or (QUICK_COMPARE_SIZES if quick else DEFAULT_COMPARE_SIZES)[args.device]
        args.compare_size_list = [parse_size("--compare-sizes", text.strip()) for text in compare_sizes.split(",")]
        args.stress_slice = parse_size("--stress-slice", args.stress_slice or STRESS_SLICE[args.device])
        args.stress_bytes = parse_size("--stress-bytes", args.stress_bytes or STRESS_BYTES[args.device])
    except (ConfigError, ValueError) as error:
        parser.error(str(error))
    if any(size % 8 for size in args.size_list) or min(args.check_size_list) < 1:
        parser.error("--sizes must be multiples of 8 bytes and --check-sizes at least 1 element")
    if any(machines < 2 or local < 1 or not 2 <= machines * local <= MAX_WORLD for machines, local in layouts):
        parser.error(f"--worlds and --compare take 2+ machines of 2 to {MAX_WORLD} processes in all")
    if args.stress_bytes % 4 or args.stress_ops < 1 or args.stress_rounds < 0:
        parser.error("--stress-bytes must be a multiple of 4, --stress-ops >= 1 and --stress-rounds >= 0")
    if args.iters < 1 or args.warmup < 0:
        parser.error("--iters must be >= 1 and --warmup >= 0")
    args.only_list = [key.strip() for key in args.only.split(",") if key.strip()]
    if unknown := [key for key in args.only_list if key not in STAGE_KEYS]:
        parser.error(f"--only: no stage {', '.join(unknown)}; the stages are {','.join(STAGE_KEYS)}")
    if any("=" not in assignment for assignment in args.set):
        parser.error("--set takes VAR=VALUE")
    return args
