"""What a real training job touches, on fairring, each checked against Gloo in the same run.

Every rank trains the same model twice from the same seed, once over fairring
and once over a Gloo group, on the same data, and the two must agree: float32
parameters to 1e-5 relative (the backends sum in different orders), compressed
or reduced-precision paths to their format's rounding. Each all-reduce goes to
fairring's engine (ENGINE_AT_EVERY_SIZE), whatever its size.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import fairring
from benchmarks.harness import ENGINE_AT_EVERY_SIZE, InitSpec, Layout, RankPool
from benchmarks.reference import rank_tensor, reduce_reference
from fairring.bench import free_port

STEPS = 8
FLOAT32 = 1e-5


@pytest.fixture(scope="module")
def ranks() -> Iterator[RankPool]:
    with RankPool(Layout(2, 2), InitSpec(extra_env=ENGINE_AT_EVERY_SIZE)) as pool:
        yield pool


# -- on every rank -------------------------------------------------------------

_gloo: dist.ProcessGroup | None = None


def gloo_group() -> dist.ProcessGroup:
    """One Gloo group over every rank, made once per rank process."""
    global _gloo
    if _gloo is None:
        _gloo = dist.new_group(backend="gloo")
    return _gloo


def mlp(branch: bool = False) -> torch.nn.Module:
    """A small MLP; `branch` adds a head used only on even steps (unused parameters)."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
            self.extra = torch.nn.Linear(10, 10) if branch else None

        def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
            y = self.body(x)
            return self.extra(y) if self.extra is not None and step % 2 == 0 else y

    torch.manual_seed(0)
    return Net()


def batch(step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + 10 * dist.get_rank() + micro)
    return torch.randn(16, 32, generator=generator), torch.randint(0, 10, (16,), generator=generator)


def relative_gap(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> float:
    gaps = [((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item() for a, b in zip(ours, theirs, strict=True)]
    return max(gaps)


def params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


Step = Callable[[torch.nn.Module, torch.optim.Optimizer, int], None]


def plain_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    optimizer.zero_grad()
    inputs, targets = batch(step)
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    optimizer.step()


def train_both(
    wrap: Callable[[torch.nn.Module, dist.ProcessGroup | None], torch.nn.Module],
    step: Step = plain_step,
    make: Callable[[], torch.nn.Module] = mlp,
    optimizer: Callable[[torch.nn.Module, dist.ProcessGroup | None], torch.optim.Optimizer] | None = None,
) -> float:
    """Trains wrap(make(), group) over fairring (group None: the default) and over Gloo."""
    results = []
    for group in (None, gloo_group()):
        model = wrap(make(), group)
        opt = optimizer(model, group) if optimizer else torch.optim.SGD(model.parameters(), lr=0.05)
        for index in range(STEPS):
            step(model, opt, index)
        results.append(params(model))
    return relative_gap(results[0], results[1])


def ddp(**options: object) -> Callable[[torch.nn.Module, dist.ProcessGroup | None], torch.nn.Module]:
    return lambda model, group: DDP(model, process_group=group, bucket_cap_mb=0.01, **options)


def gradient_penalty_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Double backward: the loss includes the squared norm of its own gradients."""
    optimizer.zero_grad()
    inputs, targets = batch(step)
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
    (loss + 0.1 * sum(g.pow(2).sum() for g in grads)).backward()
    optimizer.step()


def unused_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    optimizer.zero_grad()
    inputs, targets = batch(step)
    torch.nn.functional.cross_entropy(model(inputs, step), targets).backward()
    optimizer.step()


def accumulate_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Two micro-batches under no_sync(), the third synchronises all three."""
    optimizer.zero_grad()
    with model.no_sync():
        for micro in range(2):
            inputs, targets = batch(step, micro)
            torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    inputs, targets = batch(step, 2)
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    optimizer.step()


def autocast_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    optimizer.zero_grad()
    inputs, targets = batch(step)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()


def ddp_variant(variant: str) -> float:
    if variant == "create_graph":
        return train_both(ddp(), gradient_penalty_step)
    if variant == "gradient_as_bucket_view":
        return train_both(ddp(gradient_as_bucket_view=True))
    if variant == "static_graph":
        return train_both(ddp(static_graph=True))
    if variant == "find_unused_parameters":
        return train_both(ddp(find_unused_parameters=True), unused_step, make=lambda: mlp(branch=True))
    if variant == "no_sync":
        return train_both(ddp(), accumulate_step)
    if variant == "bf16_autocast":
        return train_both(ddp(), autocast_step)
    raise ValueError(variant)


DDP_VARIANTS = {
    "create_graph": FLOAT32,
    "gradient_as_bucket_view": FLOAT32,
    "static_graph": FLOAT32,
    "find_unused_parameters": FLOAT32,
    "no_sync": FLOAT32,
    # Both backends reduce the same fp32 gradients; autocast's bf16 forward is
    # identical on both, so only the summation order differs.
    "bf16_autocast": 1e-2,
}


@pytest.mark.parametrize("variant", list(DDP_VARIANTS))
def test_ddp_variant_matches_gloo(ranks: RankPool, variant: str) -> None:
    gaps = ranks.run(ddp_variant, variant)
    assert max(gaps) < DDP_VARIANTS[variant], gaps


def with_comm_hook(name: str) -> float:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    def wrap(model: torch.nn.Module, group: dist.ProcessGroup | None) -> torch.nn.Module:
        wrapped = DDP(model, process_group=group, bucket_cap_mb=0.01)
        hook_group = group if group is not None else dist.group.WORLD
        if name == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=hook_group, matrix_approximation_rank=2, start_powerSGD_iter=2, min_compression_rate=0.5
            )
            wrapped.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        else:
            hooks = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
            wrapped.register_comm_hook(hook_group, hooks[name])
        return wrapped

    return train_both(wrap)


# Compressed gradients are rounded to the format before they are summed, in a
# different order on each backend: the gap is that format's rounding.
COMM_HOOKS = {"fp16": 2e-3, "bf16": 2e-2, "powersgd": 1e-3}


@pytest.mark.parametrize("hook", list(COMM_HOOKS))
def test_comm_hook_matches_gloo(ranks: RankPool, hook: str) -> None:
    gaps = ranks.run(with_comm_hook, hook)
    assert max(gaps) < COMM_HOOKS[hook], gaps


def zero_redundancy() -> float:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    def optimizer(model: torch.nn.Module, group: dist.ProcessGroup | None) -> torch.optim.Optimizer:
        return ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.Adam, process_group=group, lr=0.01
        )

    return train_both(ddp(), optimizer=optimizer)


def test_zero_redundancy_optimizer_matches_gloo(ranks: RankPool) -> None:
    assert max(ranks.run(zero_redundancy)) < FLOAT32


def compiled() -> float:
    # aot_eager: dynamo's graph capture and DDP's graph splitting at bucket
    # boundaries, without inductor's C++ compile (minutes on 2 cores).
    # DDP's default buckets: its graph splitter wants the first no larger than the rest.
    return train_both(lambda model, group: torch.compile(DDP(model, process_group=group), backend="aot_eager"))


@pytest.mark.timeout(300)
def test_torch_compile_under_ddp_matches_gloo(ranks: RankPool) -> None:
    assert max(ranks.run(compiled, timeout=240)) < FLOAT32


def fsdp2() -> float:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def wrap(model: torch.nn.Module, group: dist.ProcessGroup | None) -> torch.nn.Module:
        if group is None:
            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        else:
            mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model.body:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    results = []
    for group in (None, gloo_group()):
        model = wrap(mlp(), group)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for index in range(STEPS):
            plain_step(model, opt, index)
        results.append([p.full_tensor().detach().clone() for p in model.parameters()])
    return relative_gap(results[0], results[1])


def test_fsdp2_matches_gloo(ranks: RankPool) -> None:
    assert max(ranks.run(fsdp2)) < FLOAT32


def two_dimensional_mesh() -> dict[str, object]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    result: dict[str, object] = {}
    for dim in ("dp", "tp"):
        group = mesh.get_group(dim)
        members = dist.get_process_group_ranks(group)
        tensor = rank_tensor(rank, (5000,), torch.float32, seed=3)
        dist.all_reduce(tensor, group=group)
        expected = reduce_reference([rank_tensor(r, (5000,), torch.float32, seed=3) for r in members], "sum")
        result[dim] = {
            "members": members,
            "backend": fairring.backend_of(group).name(),
            "gap": (tensor.double() - expected).abs().max().item(),
        }
    return result


def test_device_mesh_2d_runs_on_fairring(ranks: RankPool) -> None:
    for rank, result in enumerate(ranks.run(two_dimensional_mesh)):
        # Rows of the 2x2 mesh are "tp", columns "dp".
        assert result["tp"]["members"] == [rank - rank % 2, rank - rank % 2 + 1], result
        assert result["dp"]["members"] == [rank % 2, rank % 2 + 2], result
        for dim in ("dp", "tp"):
            assert result[dim]["backend"] == "fairring", result
            assert result[dim]["gap"] < 1e-5, result


def checkpoint_round_trip(directory: str) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp

    trained = DDP(mlp(), bucket_cap_mb=0.01)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.05)
    for index in range(3):
        plain_step(trained, optimizer, index)
    dcp.save({"model": trained.state_dict()}, checkpoint_id=directory)
    gaps = {}
    # Loaded once over fairring, once with Gloo coordinating: the same state.
    for name, group in (("fairring", None), ("gloo", gloo_group())):
        fresh = DDP(mlp())
        with torch.no_grad():
            for parameter in fresh.parameters():
                parameter.zero_()
        state = {"model": fresh.state_dict()}
        dcp.load(state, checkpoint_id=directory, process_group=group)
        fresh.load_state_dict(state["model"])
        gaps[name] = max(
            (a - b).abs().max().item() for a, b in zip(fresh.parameters(), trained.parameters(), strict=True)
        )
    return gaps


def test_distributed_checkpoint_save_and_load(ranks: RankPool, tmp_path: Path) -> None:
    for gaps in ranks.run(checkpoint_round_trip, str(tmp_path / "checkpoint")):
        assert gaps == {"fairring": 0.0, "gloo": 0.0}, gaps


# -- torchrun restarts a job that lost a rank ------------------------------------

RESTART_JOB = """
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
rank = int(os.environ["RANK"])
os.environ["FAIRRING_MACHINE_ID"] = f"machine-{rank}"  # one rank per machine: the rails carry it
backend, out = sys.argv[1], sys.argv[2]
dist.init_process_group(backend)
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
checkpoint = os.path.join(out, "checkpoint.pt")
start = 0
if os.path.exists(checkpoint):
    state = torch.load(checkpoint)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
restarts = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for step in range(start, 6):
    if step == 3 and rank == 1 and restarts == 0 and backend == "fairring":
        os._exit(17)  # lost mid-training, before its gradients are all-reduced
    generator = torch.Generator().manual_seed(1000 * step + rank)
    inputs, targets = torch.randn(16, 32, generator=generator), torch.randint(0, 10, (16,), generator=generator)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    optimizer.step()
    if rank == 0:
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}
        torch.save(state, checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)
    dist.barrier()
if rank == 0:
    torch.save(model.module.state_dict(), os.path.join(out, "final.pt"))
print(f"rank {rank} finished after {restarts} restart(s)", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(420)
def test_torchrun_restarts_after_losing_a_rank(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(RESTART_JOB)
    source = str(Path(fairring.__file__).parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")])),
        "TP_SOCKET_IFNAME": "lo",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "FAIRRING_FLAT_THRESHOLD": "0",
        "TORCH_INCLUDE_STACK_TRACE": "0",
    }
    finals = {}
    for backend in ("fairring", "gloo"):
        out = tmp_path / backend
        out.mkdir()
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--max-restarts=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(script), backend, str(out),
        ]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        restarts = "1" if backend == "fairring" else "0"
        finished = sorted(re.findall(rf"rank (\d) finished after {restarts} restart", done.stdout))
        assert finished == ["0", "1"], done.stdout + done.stderr
        finals[backend] = torch.load(out / "final.pt")
    for name, value in finals["fairring"].items():
        gap = ((value - finals["gloo"][name]).abs().max() / finals["gloo"][name].abs().max()).item()
        assert gap < FLOAT32, (name, gap)
