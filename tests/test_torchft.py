"""torchft runs its fault-tolerant DDP on fairring: a replica is lost mid-training, the other goes on, it rejoins.

The lighthouse runs in the test process; each replica (one rank each, on its
own emulated machine) is a real process with its own store and Manager, as
torchft's examples run them. Every address they are given or advertise is
loopback (torchft's own servers still bind every interface, as it codes them).
Replica 1 is killed (SIGKILL), then started again once replica 0 has trained alone
up to REJOIN_STEP, and heals from replica 0.
Killed between steps, the same job runs on torchft's own ProcessGroupGloo:
both must commit the same steps with the same participants and end with the
same parameters, on both replicas. Killed inside a step, fairring's failed
all-reduce must make torchft retry the step without it.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch

torchft = pytest.importorskip("torchft", reason="torchft is not installed (requirements-dev.txt installs it)")
pytestmark = pytest.mark.skipif(
    not hasattr(torch._C._distributed_c10d.Backend, "get_error"),
    reason=f"torch {torch.__version__} has no Backend.get_error (torch >= 2.15 has)",
)

STEPS = 10
FAIL_STEP = 3  # replica 1 dies inside this step
REJOIN_STEP = 6  # replica 0 waits here for the restarted replica 1
TIMEOUT = timedelta(seconds=10)


def batch(replica: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * replica + step)
    inputs = torch.randn(8, 16, generator=generator)
    return inputs, inputs[:, :4].sum(dim=1, keepdim=True)


def wait_for(path: Path, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {limit} s")
        time.sleep(0.02)


def run_replica(replica: int, attempt: int, backend: str, lighthouse: str, scratch: str, kill: str) -> None:
    """One replica's training, as torchft's DDP example trains; writes what it committed and its parameters.

    kill: where replica 1's first attempt dies at FAIL_STEP. "between-steps"
    (before it asks for the quorum): the model is torchft's DDP. "in-step"
    (after the quorum with both, before the all-reduce): the gradients go
    through `Manager.allreduce` one by one, as torchft's non-DDP loops do,
    since torchft 0.2.0's DDP comm hook asserts when an all-reduce fails
    (`assert fut._fut`, on its own ProcessGroupGloo too).
    """
    os.environ.update(FAIRRING_MACHINE_ID=f"replica-{replica}", TP_SOCKET_IFNAME="lo", FAIRRING_FLAT_THRESHOLD="0")
    import torch.distributed as dist
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupGloo

    from fairring.torchft import ProcessGroupFairring

    folder = Path(scratch)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    pg = ProcessGroupFairring(timeout=TIMEOUT) if backend == "fairring" else ProcessGroupGloo(timeout=TIMEOUT)
    rebuilds: list[float] = []
    create_pg = pg._create_pg

    def timed_create_pg(*args: object) -> object:
        started = time.perf_counter()
        made = create_pg(*args)
        rebuilds.append(time.perf_counter() - started)
        return made

    pg._create_pg = timed_create_pg  # type: ignore[method-assign]
    manager = Manager(
        pg=pg,
        min_replica_size=1,
        load_state_dict=lambda state: (
            model.load_state_dict(state["model"]),
            optimizer.load_state_dict(state["optim"]),
        ),
        state_dict=lambda: {"model": model.state_dict(), "optim": optimizer.state_dict()},
        replica_id=f"replica{replica}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        hostname="127.0.0.1",  # what it tells the lighthouse and its peers: loopback only
        timeout=TIMEOUT,
        quorum_timeout=timedelta(seconds=60),
        use_async_quorum=False,
    )
    ddp = DistributedDataParallel(manager, model)
    wrapped = OptimizerWrapper(manager, optimizer)
    record = []
    step_seconds = []  # each step's, from its quorum to its commit
    (folder / f"ready-{replica}-{attempt}").write_text("")
    if attempt == 0:
        wait_for(folder / f"ready-{1 - replica}-0")  # both heartbeat before either asks for a quorum
    while manager.current_step() < STEPS:
        if replica == 0 and manager.current_step() == REJOIN_STEP:
            (folder / "rejoin").write_text("")  # replica 1 restarts only now: the steps before are ours alone
            wait_for(folder / "ready-1-1")  # the restarted replica asks first; the lighthouse waits for this one
            # Its manager heartbeats every 100 ms from a thread of its own: ready is not yet heard. Without
            # this wait, a loaded machine let this step's quorum form without it (it joined a step later).
            time.sleep(1.0)
        dies = replica == 1 and attempt == 0 and manager.current_step() == FAIL_STEP
        if dies and kill == "between-steps":
            os.kill(os.getpid(), signal.SIGKILL)
        started = time.perf_counter()
        wrapped.zero_grad()  # the quorum, synchronously: a replica that heals gets its step here
        if dies:
            os.kill(os.getpid(), signal.SIGKILL)
        step = manager.current_step()
        inputs, target = batch(replica, step)
        if kill == "in-step":
            torch.nn.functional.mse_loss(model(inputs), target).backward()
            for work in [manager.allreduce(parameter.grad) for parameter in model.parameters()]:
                work.wait()  # False where it failed: torchft then does not commit the step
        else:
            torch.nn.functional.mse_loss(ddp(inputs), target).backward()
        wrapped.step()
        record.append([step, manager.num_participants(), manager.current_step() > step])
        step_seconds.append(time.perf_counter() - started)
    result = {
        "record": record,
        "parameters": [parameter.detach().tolist() for parameter in model.parameters()],
        "rebuild_s": rebuilds,
        "step_s": step_seconds,
    }
    (folder / f"result-{replica}-{attempt}.json").write_text(json.dumps(result))
    manager.shutdown(wait=False)


def run_job(backend: str, kill: str, scratch: Path) -> dict[int, dict[str, object]]:
    from torchft._torchft import LighthouseServer

    scratch.mkdir()
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, heartbeat_timeout_ms=2000, join_timeout_ms=30000)
    # Its own address() names this machine's hostname; the replicas reach it on loopback.
    address = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]
    context = mp.get_context("spawn")
    processes = []
    try:

        def start(replica: int, attempt: int) -> mp.process.BaseProcess:
            process = context.Process(
                target=run_replica,
                args=(replica, attempt, backend, address, str(scratch), kill),
                daemon=True,
            )
            process.start()
            processes.append(process)
            return process

        first = start(0, 0)
        lost = start(1, 0)
        lost.join(timeout=90)
        assert lost.exitcode == -signal.SIGKILL, f"replica 1 was to die at step {FAIL_STEP}: {lost.exitcode}"
        # Restarted at once, it could join replica 0's retry of FAIL_STEP, and no step would be replica 0's alone.
        wait_for(scratch / "rejoin", limit=90)
        rejoined = start(1, 1)
        for process in (first, rejoined):
            process.join(timeout=120)
            assert process.exitcode == 0, f"{process.name} exited with {process.exitcode}"
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
        lighthouse.shutdown()
    return {replica: json.loads((scratch / f"result-{replica}-{replica}.json").read_text()) for replica in (0, 1)}


def report(backend: str, results: dict[int, dict[str, object]]) -> None:
    for replica, result in results.items():
        rebuilds = ", ".join(f"{seconds * 1000:.0f}" for seconds in result["rebuild_s"])
        steps = ", ".join(f"{seconds * 1000:.0f}" for seconds in result["step_s"])
        print(f"{backend} replica {replica}: [step, participants, committed] {result['record']}")
        print(f"  its group rebuilds took (ms): {rebuilds}; its steps, the quorum's wait included (ms): {steps}")


def assert_survived(results: dict[int, dict[str, object]]) -> None:
    """Replica 0 committed every step, some alone; both replicas end together with the same parameters."""
    survivor = results[0]["record"]
    assert [step for step, _, committed in survivor if committed] == list(range(STEPS)), survivor
    assert any(participants == 1 for _, participants, _ in survivor), survivor
    assert survivor[-1][1] == 2 and results[1]["record"][-1] == survivor[-1], results
    for got, want in zip(results[1]["parameters"], results[0]["parameters"], strict=True):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=0)


@pytest.mark.timeout(300)
def test_torchft_ddp_survives_a_replica_killed_inside_a_step(tmp_path: Path) -> None:
    """The replica dies between the quorum and the all-reduce: fairring's all-reduce fails, torchft retries."""
    results = run_job("fairring", "in-step", tmp_path / "fairring")
    report("fairring", results)
    assert_survived(results)


@pytest.mark.timeout(400)
def test_torchft_ddp_loses_a_replica_and_heals_as_on_gloo(tmp_path: Path) -> None:
    jobs = {backend: run_job(backend, "between-steps", tmp_path / backend) for backend in ("fairring", "gloo")}
    for backend, results in jobs.items():
        report(backend, results)
        assert_survived(results)
    for replica in (0, 1):
        fairring_run, gloo_run = jobs["fairring"][replica], jobs["gloo"][replica]
        assert fairring_run["record"] == gloo_run["record"], (replica, fairring_run, gloo_run)
        for got, want in zip(fairring_run["parameters"], gloo_run["parameters"], strict=True):
            torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
