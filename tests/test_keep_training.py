"""A DDP job that loses a rank keeps training: the survivors catch the error, shrink, rebuild DDP, finish.

The rank is killed for real (SIGKILL) mid-training. The survivors' parameters
are checked against a plain torch replay of the same training (every rank's
batches averaged before the failure, the survivors' after), not against
each other alone. docs/troubleshooting.md ("Keep training after a failure")
shows the same loop.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from benchmarks.harness import InitSpec, Layout, RankFailure, RankPool

pytestmark = pytest.mark.skipif(
    not hasattr(torch._C._distributed_c10d.Backend, "get_error"),
    reason=f"torch {torch.__version__} has no Backend.get_error (torch >= 2.15 has)",
)

STEPS = 12
LEARNING_RATE = 0.1
FAULT_TIMEOUT = timedelta(seconds=10)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s batch at `step` (ranks of the job at its start): a target the model can learn."""
    generator = torch.Generator().manual_seed(1000 * rank + step)
    inputs = torch.randn(8, 16, generator=generator)
    return inputs, inputs[:, :4].sum(dim=1, keepdim=True)


def train_through_a_lost_rank(victim: int, fail_step: int) -> dict[str, object]:
    """The loop of docs/troubleshooting.md: on a collective's error, shrink without the lost rank and go on."""
    me = dist.get_rank()  # this rank's number in the job as it started: it names its data
    model = make_model()
    ddp = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    last_good = {name: value.clone() for name, value in model.state_dict().items()}
    losses: dict[int, float] = {}  # by step: a step redone after the failure counts once
    step = 0
    resumed_at = None
    while step < STEPS:
        if me == victim and step == fail_step:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            inputs, target = batch(me, step)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(inputs), target)
            loss.backward()
            optimizer.step()
        except RuntimeError as error:
            assert f"rank {victim} " in str(error), error  # fairring names the lost rank
            del ddp  # its hooks go with it
            dist.shrink_group([victim])
            # The last state this rank finished; DDP's constructor then gives
            # every survivor the new rank 0's, which may be a step behind.
            model.load_state_dict(last_good)
            ddp = DDP(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
            step_now = torch.tensor([step])
            dist.broadcast(step_now, src=0)
            step = resumed_at = int(step_now.item())
            continue
        last_good = {name: value.clone() for name, value in model.state_dict().items()}
        losses[step] = loss.item()
        step += 1
    return {
        "losses": losses,
        "resumed_at": resumed_at,
        "size": dist.get_world_size(),
        # Plain lists: a tensor would travel back as shared memory of a process that is leaving.
        "parameters": [parameter.detach().tolist() for parameter in model.parameters()],
    }


def replay(world: int, victim: int, resumed_at: int) -> tuple[list[torch.Tensor], dict[int, list[float]]]:
    """The same training in one process: gradients averaged over every rank, then over the survivors.

    Returns the parameters at the end, and each rank's loss at each step.
    """
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    losses: dict[int, list[float]] = {rank: [] for rank in range(world)}
    for step in range(STEPS):
        ranks = range(world) if step < resumed_at else [rank for rank in range(world) if rank != victim]
        optimizer.zero_grad()
        for rank in ranks:
            inputs, target = batch(rank, step)
            loss = torch.nn.functional.mse_loss(model(inputs), target)
            losses[rank].append(loss.item())
            (loss / len(ranks)).backward()
        optimizer.step()
    return [parameter.detach() for parameter in model.parameters()], losses


@pytest.mark.timeout(180)
def test_ddp_survives_a_killed_rank_and_matches_a_replay() -> None:
    layout = Layout(2, 2)
    victim, fail_step = 3, 5
    with RankPool(layout, InitSpec(timeout=FAULT_TIMEOUT)) as ranks:
        with pytest.raises(RankFailure) as failure:
            ranks.run(train_through_a_lost_rank, victim, fail_step, timeout=150)
    results = failure.value.results
    assert set(results) == {0, 1, 2}, failure.value
    resumed = {result["resumed_at"] for result in results.values()}
    assert len(resumed) == 1, resumed
    resumed_at = resumed.pop()
    assert resumed_at in (fail_step - 1, fail_step), resumed_at
    expected, expected_losses = replay(layout.world_size, victim, resumed_at)
    # The reference itself learns: its loss falls over the run.
    first, last = expected_losses[0][:4], expected_losses[0][-4:]
    assert sum(last) < 0.5 * sum(first), expected_losses[0]
    for rank, result in sorted(results.items()):
        losses = result["losses"]
        print(f"rank {rank}: resumed at step {resumed_at} on {result['size']} ranks; losses {losses}")
        assert result["size"] == 3, result
        # Every step's loss, before and after the failure, is the replay's.
        assert sorted(losses) == list(range(STEPS)), losses
        torch.testing.assert_close(
            torch.tensor([losses[step] for step in range(STEPS)]), torch.tensor(expected_losses[rank])
        )
        for got, want in zip(result["parameters"], expected, strict=True):
            torch.testing.assert_close(torch.tensor(got), want, rtol=1e-5, atol=1e-6)
