"""`python -m fairring.validate`: end to end under torchrun (2 agents as 2 machines), and its pure parts.

The runs: CPU tensors on loopback; the emulated CUDA device in launch order;
two network-namespace hosts shaped to 1 Gbit/s, where "of bound" must be the
bound computed from that rate; and the checker's negative control, a run whose
engine results rank 0 damages, which must count them and exit 1.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import fairring
from fairring.bench import free_port
from fairring.bench.launch import MASTER_PORT_IN_NAMESPACE, stop_agents
from fairring.bench.netns import Host, NetnsCluster, netns_available
from fairring.validate import check, cli, launch, network, report, sweep
from fairring.validate.sweep import geometric_sizes

ROOT = Path(__file__).parents[1]
KiB, MiB = 1024, 1024 * 1024


@dataclass
class Finished:
    codes: list[int]  # per agent; negative: killed (by a signal, at the deadline)
    logs: list[str]


def run_validate(
    tmp_path: Path,
    arguments: list[str],
    env: dict[str, str] | None = None,
    hosts: list[Host] | None = None,
    ranks_per_agent: int = 2,
    timeout: float = 60,
) -> Finished:
    """fairring.validate on 2 torchrun agents (machines, by torchrun's GROUP_RANK) of `ranks_per_agent` ranks."""
    master, port = (hosts[0].address, MASTER_PORT_IN_NAMESPACE) if hosts else ("127.0.0.1", free_port())
    interface = "eth0" if hosts else "lo"
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TP_SOCKET_IFNAME": interface, "GLOO_SOCKET_IFNAME": interface}
    environment.update(env or {})
    agents: list[subprocess.Popen[bytes]] = []
    logs = [tmp_path / f"agent{node}.log" for node in range(2)]
    try:
        for node, log in enumerate(logs):
            command = [
                sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
                f"--nproc-per-node={ranks_per_agent}", f"--master-addr={master}", f"--master-port={port}",
                "-m", "fairring.validate", *arguments,
            ]  # fmt: skip
            if hosts:
                command = ["ip", "netns", "exec", hosts[node].name, *command]
            with open(log, "wb") as sink:
                started = subprocess.Popen(
                    command, stdout=sink, stderr=subprocess.STDOUT, env=environment, cwd=ROOT, start_new_session=True
                )
            agents.append(started)
        deadline = time.monotonic() + timeout
        for agent in agents:
            try:
                agent.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    finally:
        stop_agents(agents)  # SIGTERM (torchrun stops its ranks), then SIGKILL; ranks die with their agent
    return Finished([agent.returncode for agent in agents], [log.read_text(errors="replace") for log in logs])


def results_of(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def assert_complete(document: dict[str, Any], paths: set[str], sizes: list[int], passes: int = 2) -> None:
    """Every path at every size, every element right, the engine really serving the engine path."""
    assert set(document["paths"]) == paths
    for name, path in document["paths"].items():
        assert [row["bytes"] for row in path["results"]] == sizes, name
        for row in path["results"]:
            assert row["wrong"] == 0 and row["time_us"] > 0, (name, row)
            assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * passes * 3 / 4)  # n = 4
    assert document["wrong"] == 0 and document["machines"] == 2 and document["machine_sizes"] == [2, 2]
    stats = document["engine_stats"]
    assert stats["ops"] > 0 and stats["flat_ops"] == 0
    assert [row["bytes"] for row in document["comparison"]] == sizes
    assert sorted(rank for group in document["rails"] for rank in group["ranks"]) == [0, 1, 2, 3]


@pytest.mark.timeout(90)
def test_cpu_two_machines_under_torchrun(tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    finished = run_validate(
        tmp_path, ["--device", "cpu", "-b", "64KiB", "-e", "1MiB", "-n", "3", "-w", "1", "--json", str(out)]
    )
    assert finished.codes == [0, 0], finished.logs
    document = results_of(out)
    assert_complete(document, {"fairring", "gloo"}, [64 * KiB, 256 * KiB, MiB])
    # On loopback the kernel reports no NIC speed: "of bound" is unknown, and the output says how to give it.
    assert document["bound"]["source"] == "unknown" and all(row["of_bound"] is None for row in document["comparison"])
    assert "--nic-gbps" in document["bound"]["why_unknown"]
    verdict = document["verdict"]["text"]
    output = finished.logs[0]
    assert output.rstrip().endswith(verdict) and verdict.startswith("fairring's engine")
    assert document["environment"]["fairring"]["fairring"] == fairring.__version__
    assert "#wrong" in output and "# Out of bounds values : 0 OK" in output
    assert document["rails"][0]["interface"] == "lo" and document["rails"][0]["transport"] == "tensorpipe"
    # fairring.summary() of the engine's group: only engine all-reduces, timed (the last one's interval may
    # end just after its wait returned), and said in the output.
    [engine] = document["fairring_summary"]
    assert (engine["collective"], engine["path"]) == ("all_reduce", "engine")
    assert engine["ops"] - 1 <= engine["timed_ops"] <= engine["ops"] and engine["busy_s"] > 0, engine
    assert "fairring.summary(engine group): rank 0: cpu all_reduce: engine " in output


@pytest.mark.timeout(90)
def test_a_run_the_engine_did_not_serve_fails(tmp_path: Path) -> None:
    """One machine (every rank given the same FAIRRING_MACHINE_ID): the engine serves nothing, so nothing is
    judged, and the run exits non-zero as nccl-tests does on an empty run, saying why."""
    finished = run_validate(
        tmp_path, ["--device", "cpu", "-b", "64KiB", "-e", "64KiB", "-n", "1", "-w", "0"],
        env={"FAIRRING_MACHINE_ID": "one-machine"},
    )  # fmt: skip
    assert all(code != 0 for code in finished.codes), finished.logs
    assert "there is nothing to judge" in finished.logs[0]
    assert "exitcode  : 3" in "".join(finished.logs) or "exitcode: 3" in "".join(finished.logs), finished.logs


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("collective", "flags"),
    [
        ("reduce_scatter", []),
        # nccl-tests' other column and its back-to-back ops: each op its own buffers, each result checked.
        # (An in-place all-gather runs in the GPU check's CPU flow and tests/test_reduce_scatter_all_gather.py.)
        ("all_gather", ["--out-of-place", "--in-flight", "3"]),
    ],
    ids=["reduce_scatter-in-place", "all_gather-out-of-place-3-in-flight"],
)
def test_reduce_scatter_and_all_gather(tmp_path: Path, collective: str, flags: list[str]) -> None:
    """--collective: each checked against its own expected result, with nccl-tests' busbw and (M-1)/M bound."""
    out = tmp_path / "v.json"
    arguments = ["--device", "cpu", "--collective", collective, "-b", "64KiB", "-e", "1MiB", "-f", "16", *flags]
    finished = run_validate(tmp_path, [*arguments, "-n", "2", "-w", "1", "--nic-gbps", "1", "--json", str(out)])
    assert finished.codes == [0, 0], finished.logs
    document = results_of(out)
    assert_complete(document, {"fairring", "gloo"}, [64 * KiB, MiB], passes=1)
    assert document["collective"] == collective and f"# fairring.validate: {collective}" in finished.logs[0]
    assert (document["in_place"], document["in_flight"]) == (not flags, 3 if flags else 1)
    assert f"# fairring, {'out of place' if flags else 'in place'}" in finished.logs[0]
    row = document["comparison"][-1]
    assert row["bound_us"] == pytest.approx((2 - 1) / 2 * MiB / 125e6 * 1e6)  # (M-1)/M x S over 1 Gbit/s


@pytest.mark.parametrize("out_of_place", [False, True], ids=["in-place", "out-of-place"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_an_output_the_op_never_wrote_is_wrong(collective: str, out_of_place: bool) -> None:
    """Negative control of the buffers: before each op its output is poisoned, so one it skipped counts."""
    world, rank, count, cpu = 4, 1, 4 * 1001, torch.device("cpu")
    source = check.rank_input(rank, count, torch.float32, cpu)
    expected = check.expected_result(collective, rank, world, count, torch.float32, cpu)
    slot = sweep.Buffers.make(source, rank, world, collective, out_of_place)
    slot.reset(source, rank, world)  # and no op: what it would have written is missing
    # An all-gather in place already holds this rank's own chunk; nothing else is right.
    right = 1001 if collective == "all_gather" and not out_of_place else 0
    assert check.count_wrong(slot.result, expected) == expected.numel() - right


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_checker_expects_each_rank_its_own_result(collective: str) -> None:
    """The expected results against a plain computation of every rank's input, and an off-by-one chunk caught."""
    world, count, cpu = 4, 4 * 1001, torch.device("cpu")
    inputs = [check.rank_input(rank, count, torch.float32, cpu) for rank in range(world)]
    for rank in range(world):
        expected = check.expected_result(collective, rank, world, count, torch.float32, cpu)
        if collective == "reduce_scatter":
            plain = torch.stack(inputs).sum(0).view(world, -1)[rank]
        else:
            plain = torch.cat([inputs[r].view(world, -1)[r] for r in range(world)])
        assert check.count_wrong(plain, expected) == 0
        shifted = torch.stack(inputs).sum(0).view(world, -1)[(rank + 1) % world]
        if collective == "all_gather":
            shifted = torch.cat([inputs[r].view(world, -1)[(r + 1) % world] for r in range(world)])
        assert check.count_wrong(shifted, expected) > 0


@pytest.mark.timeout(90)
def test_emulated_cuda_device_in_launch_order(tmp_path: Path) -> None:
    """The CUDA engine's ordering code (the emulated device, every stream in launch order, Gloo local steps as
    the emulated NCCL) serves the engine path; slices of 64 KiB make each all-reduce several."""
    out = tmp_path / "v.json"
    emulated = {
        "FAIRRING_TEST_EMULATED_DEVICE": "seed=3,in_order",
        "FAIRRING_SHM_DISABLE": "1",
        "FAIRRING_SLICE_SIZE": "64KiB",
        "FAIRRING_MIN_SHARD_SIZE": "0",
    }
    arguments = ["--device", "cpu", "-b", "64KiB", "-e", "1MiB", "-f", "16", "-n", "3", "-w", "1", "--json", str(out)]
    finished = run_validate(tmp_path, arguments, emulated)
    assert finished.codes == [0, 0], finished.logs
    document = results_of(out)
    assert_complete(document, {"fairring", "gloo"}, [64 * KiB, MiB])
    assert document["emulated_device"] == "seed=3,in_order"
    assert document["engine_stats"]["slices"] > document["engine_stats"]["ops"]  # multi-slice all-reduces
    assert document["verdict"]["text"] and "emulated CUDA device" in finished.logs[0]


@pytest.mark.timeout(90)
def test_of_bound_on_hosts_shaped_to_1gbit(tmp_path: Path) -> None:
    available, reason = netns_available()
    if not available:
        print(f"skipped: network namespaces unavailable: {reason}")
        pytest.skip(f"network namespaces unavailable: {reason}")
    out = tmp_path / "v.json"
    arguments = ["--device", "cpu", "-b", "16MiB", "-e", "16MiB", "-n", "5", "-w", "2", "--nic-gbps", "1"]
    with NetnsCluster(2, rate="1gbit") as cluster:
        finished = run_validate(tmp_path, [*arguments, "--json", str(out)], hosts=cluster.hosts)
    assert finished.codes == [0, 0], finished.logs
    document = results_of(out)
    assert_complete(document, {"fairring", "gloo"}, [16 * MiB])
    assert document["bound"]["bytes_per_s"] == 125e6 and document["bound"]["source"] == "--nic-gbps"
    row, engine = document["comparison"][0], document["paths"]["fairring"]["results"][0]
    bound_us = 2 * (2 - 1) / 2 * 16 * MiB / 125e6 * 1e6  # 2(M-1)/M x S over 1 Gbit/s
    assert row["bound_us"] == pytest.approx(bound_us)
    assert row["of_bound"] == pytest.approx(bound_us / engine["time_us"])
    # tbf lets up to 10 ms of traffic through at line rate once it has idled (fairring/bench/netns.py), and it
    # idles between ops (the check, the copy, the barrier): an op may beat the bound by that much (it did by 9%
    # in 1 of 4 runs at 4 MiB), no more. At 16 MiB that is at most 1.08.
    burst_us = 10_000
    assert 0.5 <= row["of_bound"] <= bound_us / (bound_us - burst_us), row
    # Each host's ranks put the rails on its own NIC.
    assert {group["interface"] for group in document["rails"]} == {"eth0"}


@pytest.mark.timeout(60)
def test_corrupted_results_are_counted_and_fail_the_run(tmp_path: Path) -> None:
    """Negative control: rank 0 adds 1 to one element of every engine result before the check."""
    out = tmp_path / "v.json"
    arguments = ["--device", "cpu", "-b", "64KiB", "-e", "64KiB", "-n", "2", "-w", "1", "--json", str(out)]
    finished = run_validate(tmp_path, [*arguments, "--corrupt-for-test"], ranks_per_agent=1)
    assert finished.codes == [1, 1], finished.logs
    document = results_of(out)
    assert [row["wrong"] for row in document["paths"]["fairring"]["results"]] == [3]  # one per iteration
    assert [row["wrong"] for row in document["paths"]["gloo"]["results"]] == [0]
    assert document["verdict"]["engine_wins"] is False and "3 wrong element(s)" in document["verdict"]["text"]
    assert "# Out of bounds values : 3 FAILED" in finished.logs[0]


@pytest.mark.parametrize("dtype", list(check.DTYPES.values()), ids=str)
def test_checker_expects_the_exact_sum_and_counts_wrong_elements(dtype: torch.dtype) -> None:
    # bfloat16's limit, 128 ranks, where its partial sums reach 256, the last exact integer.
    world, count = min(check.max_ranks(dtype), 128), 3 * check.PERIOD + 5
    inputs = [check.rank_input(rank, count, dtype, torch.device("cpu")) for rank in range(world)]
    expected = check.expected_sum(world, count, dtype, torch.device("cpu"))
    total = torch.zeros(count, dtype=dtype)
    for tensor in inputs:  # summed in the dtype, as a reduction does: every partial sum stays exact
        total += tensor
    assert check.count_wrong(total, expected) == 0
    assert set(inputs[1][:100].tolist()) == {-1.0, 0.0, 1.0}  # g(1) = 0: the index pattern itself
    total[7] += 1
    total[count - 1] = float("nan")
    assert check.count_wrong(total, expected) == 2
    # An unreduced input, a missing rank: most elements wrong.
    assert check.count_wrong(inputs[0], expected) > count // 2
    assert check.count_wrong(total - inputs[2], expected) > count // 2


def test_srun_variables_stand_for_torchruns() -> None:
    environ = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2"}
    environ |= {"SLURM_TASKS_PER_NODE": "2(x3),2", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    where = launch.placement(environ)
    assert (where.rank, where.world_size, where.local_rank, where.local_world_size) == (5, 8, 1, 2)
    assert where.launcher == "srun" and environ["RANK"] == "5" and environ["LOCAL_WORLD_SIZE"] == "2"
    assert launch.tasks_on_node("4(x2),3", 2) == 3 and launch.tasks_on_node("8", 0) == 8
    with pytest.raises(launch.LaunchError, match="MASTER_ADDR and MASTER_PORT are unset: export MASTER_ADDR"):
        launch.placement({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})
    with pytest.raises(launch.LaunchError, match="RANK is unset: start one process per rank with torchrun"):
        launch.placement({})
    # torchrun's own variables win over srun's (torchrun started by srun).
    torchrun = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "SLURM_PROCID": "0"}
    where = launch.placement({**torchrun, "MASTER_ADDR": "a", "MASTER_PORT": "1"})
    assert (where.rank, where.local_rank, where.launcher) == (3, 1, "torchrun")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where torch sees no GPU")
def test_cuda_without_a_gpu_fails_clearly() -> None:
    where = launch.Placement(0, 2, 0, 2, "torchrun")
    with pytest.raises(launch.LaunchError, match="torch sees no CUDA device here"):
        launch.rank_device("cuda", where, share_gpu=False, environ={})


def test_verdict_names_the_size_from_which_the_engine_wins_every_larger_one() -> None:
    sizes = geometric_sizes(MiB, 64 * MiB, 4)
    assert sizes == [MiB, 4 * MiB, 16 * MiB, 64 * MiB]
    won = report.verdict(sizes, [5, 9, 10, 30], [4, 10, 9, 40], "cuda", "nccl", wrong=0)
    assert (won.engine_wins, won.from_bytes, won.flat_threshold) == (True, 64 * MiB, "64MiB")
    assert "set FAIRRING_CUDA_ENGINE=1 and FAIRRING_FLAT_THRESHOLD=64MiB" in won.text
    everywhere = report.verdict(sizes, [1, 1, 1, 1], [2, 2, 2, 2], "cpu", "gloo", wrong=0)
    assert everywhere.flat_threshold == "1MiB" and "sweep smaller sizes (-b)" in everywhere.text
    lost = report.verdict(sizes, [1, 1, 1, 3], [2, 2, 2, 2], "cuda", "nccl", wrong=0)
    assert (lost.engine_wins, lost.flat_threshold) == (False, None) and "keep nccl" in lost.text
    wrong = report.verdict(sizes, [1, 1, 1, 1], [2, 2, 2, 2], "cuda", "nccl", wrong=7)
    assert not wrong.engine_wins and wrong.text.startswith("7 wrong element(s)")


def test_bound_from_sysfs_is_the_slowest_machines_nics(tmp_path: Path) -> None:
    for interface, speed in {"ib0": "100000", "ib1": "100000", "eth0": "25000", "veth": "-1"}.items():
        (tmp_path / interface).mkdir()
        (tmp_path / interface / "speed").write_text(speed + "\n")
    assert network.nic_speed_mbps("ib0", tmp_path) == 100000
    assert network.nic_speed_mbps("veth", tmp_path) is None and network.nic_speed_mbps("lo", tmp_path) is None

    def rank(number: int, machine: int, interface: str) -> dict[str, Any]:
        host = f"host{machine}"
        return {"rank": number, "machine": machine, "host": host, "interface": interface,
                "nic_mbps": network.nic_speed_mbps(interface, tmp_path)}  # fmt: skip

    # Machine 0: two rails on two 100 Gbit/s NICs; machine 1: both rails on one 25 Gbit/s NIC.
    ranks = [rank(0, 0, "ib0"), rank(1, 0, "ib1"), rank(2, 1, "eth0"), rank(3, 1, "eth0")]
    bound = network.nic_bound(ranks, nic_gbps=None)
    assert (bound.bytes_per_s, bound.source) == (25e9 / 8, "sysfs")
    assert [machine["bytes_per_s"] for machine in bound.machines] == [200e9 / 8, 25e9 / 8]
    assert bound.seconds(64 * MiB, 2) == pytest.approx(64 * MiB / (25e9 / 8))
    unknown = network.nic_bound([*ranks[:2], rank(2, 1, "veth")], nic_gbps=None)
    assert unknown.bytes_per_s is None and "host1:veth" in unknown.why_unknown and "--nic-gbps" in unknown.why_unknown
    assert network.nic_bound(ranks, nic_gbps=1).bytes_per_s == 125e6


def test_arguments_take_nccl_tests_names_and_the_devices_defaults() -> None:
    assert cli.parse_args(["--device", "cpu"]).sizes == geometric_sizes(64 * KiB, 64 * MiB, 4)
    assert cli.parse_args(["--device", "cuda"]).sizes == geometric_sizes(MiB, 1024 * MiB, 4)
    args = cli.parse_args(
        ["--device", "cpu", "--minbytes", "1K", "--maxbytes", "1M", "--stepfactor", "32", "-d", "float16"]
    )
    assert (args.sizes, args.datatype, args.iters, args.warmup_iters) == ([KiB, 32 * KiB, MiB], "float16", 20, 5)
    for wrong in (["-f", "1"], ["-b", "2MiB", "-e", "1MiB"], ["-b", "lots"], ["-n", "0"], ["--share-gpu"]):
        with pytest.raises(SystemExit):
            cli.parse_args(["--device", "cpu", *wrong])


def test_the_json_names_the_versions_the_build_and_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the bench's records do: python, torch, fairring's version and build_info(), and the settings in effect."""
    monkeypatch.setenv("FAIRRING_SLICE_SIZE", "2MiB")
    topology = SimpleNamespace(num_machines=2, machine_sizes=[1, 1])
    served = SimpleNamespace(topology=topology, engine_stats=lambda device: {"ops": 1, "flat_ops": 0})
    monkeypatch.setattr(fairring, "backend_of", lambda group, device: served)
    args = cli.parse_args(["--device", "cpu", "-b", "64KiB", "-e", "64KiB"])
    run = cli.Run(args, ["--device", "cpu"], launch.Placement(0, 2, 0, 1, "torchrun"), torch.device("cpu"))
    paths = [sweep.Contender(name, name, None) for name in ("fairring", "gloo")]
    rows = {path.name: [sweep.Row(64 * KiB, 16 * KiB, 1e-3, 0)] for path in paths}
    ranks = [
        {"rank": rank, "host": "host", "machine": rank, "interface": "lo", "nic_mbps": None,
         "chosen_by_first_all_reduce": False}
        for rank in range(2)
    ]  # fmt: skip
    environment = json.loads(json.dumps(cli.summarize(run, paths, rows, ranks)))["environment"]  # as written
    assert environment["python"] == platform.python_version() and environment["torch"] == torch.__version__
    assert environment["fairring"] == fairring.build_info()
    assert environment["fairring"]["fairring"] == fairring.__version__
    assert environment["fairring_env"]["FAIRRING_SLICE_SIZE"] == "2MiB"
    assert environment["fairring_settings"]["FAIRRING_SLICE_SIZE"] == 2 * MiB
