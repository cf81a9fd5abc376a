"""CUDA tensors through fairring (routed to NCCL). Needs a GPU.

One process per GPU: NCCL refuses two ranks of one communicator on one GPU, and
the machines lent to this project have one GPU, so these run a 1-rank group.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from harness import Layout, RankPool
from reference import assert_matches, rank_tensor

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch"),
]


def cuda_collectives() -> None:
    import fairring

    assert fairring.build_info()["cuda_path"], "this extension was built without its CUDA path"
    torch.cuda.set_device(0)
    tensor = rank_tensor(0, (1000,), torch.float32).cuda()
    dist.all_reduce(tensor)
    assert_matches(tensor.cpu(), rank_tensor(0, (1000,), torch.float32))
    gathered = torch.empty(1000, device="cuda")
    dist.all_gather_into_tensor(gathered, tensor)
    assert_matches(gathered.cpu(), tensor.cpu())
    future = dist.all_reduce(tensor, async_op=True).get_future()
    assert_matches(future.wait()[0].cpu(), rank_tensor(0, (1000,), torch.float32))
    dist.barrier()


def test_cuda_collectives_single_rank() -> None:
    with RankPool(Layout(1, 1)) as ranks:
        ranks.run(cuda_collectives)
