"""Run by `make wheel-check` from a fresh virtual environment, outside the checkout:
a 2-rank all-reduce (2 machines x 1 rank, so the Herring engine serves it) with the
installed wheel, checked against torch's own sum."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def rank_main(rank: int, port: int) -> None:
    os.environ.update(FAIRRING_MACHINE_ID=f"machine{rank}", TP_SOCKET_IFNAME="lo", GLOO_SOCKET_IFNAME="lo")
    import fairring

    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("fairring", store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    inputs = [torch.arange(1 << 20, dtype=torch.float32) * (r + 1) for r in range(WORLD)]
    tensor = inputs[rank].clone()
    dist.all_reduce(tensor)
    assert torch.equal(tensor, sum(inputs)), "wrong all-reduce result"
    assert fairring.backend_of().engine_stats()["ops"] == 1, "the engine did not serve the all-reduce"
    if rank == 0:
        print(f"wheel smoke: fairring {fairring.__version__} from {os.path.dirname(fairring.__file__)}: ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(rank_main, args=(port,), nprocs=WORLD, start_method="spawn")
    sys.exit(0)
