"""What the CUDA engine's launch order costs DDP-style buckets, on the emulated device (`make launch-order-cost`).

On a device with streams the engine launches its local steps in one order on
every rank (csrc/engine/launch_order.h), and an op's first reduce-scatter
follows the previous op's last all-gather: back-to-back buckets pay a pipeline
fill and drain at each op boundary. This runs `python -m fairring.bench --study
overlap` (8 all-reduces of 25 MiB issued at once, then waited for) on the
emulated device, whose streams are worker threads that progress on their own,
with the launch order and with `unordered_launch` (each stage launches as it
gets there, which a device whose streams progress independently allows), on
each layout and network given, and prints the time of each and what the order
costs. Every result is checked by the bench.

    python benchmarks/launch_order_cost.py                    # 2x2 and 3x2, loopback and 1gbit
    python benchmarks/launch_order_cost.py --layouts 2x2 --networks 1gbit -n 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Gloo local steps (as NCCL's block their stream), no jitter: the order's own cost.
EMULATED = "seed=1,jitter_us=0"
ORDERS = {"launch order": EMULATED, "unordered_launch": f"{EMULATED},unordered_launch"}


def run(layout: str, network: str, device: str, iters: int) -> dict:
    """One bench run's fairring record (the overlap study's, at 4 slices in flight)."""
    machines, ranks = layout.split("x")
    place = ["--loopback"] if network == "loopback" else ["--link", network]
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "records.json"
        command = [sys.executable, "-m", "fairring.bench", "--hosts", machines, "--ranks-per-host", ranks, *place]
        command += ["--study", "overlap", "--buckets", "8", "--bucket-size", "25MiB", "--inflight", "4"]
        command += ["-n", str(iters), "-w", "1", "--json", str(output), "--plots", scratch]
        command += ["--set", f"FAIRRING_TEST_EMULATED_DEVICE={device}", "--set", "FAIRRING_SHM_DISABLE=1"]
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        records = json.loads(output.read_text())["records"]
    (ours,) = [r for r in records if r["backend"] == "fairring"]
    return ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default="2x2,3x2", help="machines x ranks (default 2x2,3x2)")
    parser.add_argument("--networks", default="loopback,1gbit", help="loopback and/or NIC rates (default both)")
    parser.add_argument("-n", "--iters", type=int, default=5, help="timed iterations per run (default 5)")
    args = parser.parse_args()
    print(f"{'layout':>7} {'network':>9} {'launch order s':>15} {'unordered s':>12} {'order costs':>12}  correct")
    for layout in args.layouts.split(","):
        for network in args.networks.split(","):
            records = {name: run(layout, network, device, args.iters) for name, device in ORDERS.items()}
            ordered, unordered = (statistics.median(records[name]["seconds"]) for name in ORDERS)
            correct = all(record["correct"] for record in records.values())
            print(
                f"{layout:>7} {network:>9} {ordered:>15.3f} {unordered:>12.3f} {ordered / unordered - 1:>+12.1%}  "
                f"{'yes' if correct else 'NO'}",
                flush=True,
            )


if __name__ == "__main__":
    main()
