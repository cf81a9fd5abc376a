"""Which NICs UCX puts one NIXL write through, given the devices fairring gives a rail or others.

Two hosts (network namespaces), each with two NICs on two networks (eth0, eth1), as in
tests/test_rails_interfaces.py. Each host's rank runs a bare NIXL agent with UCX_NET_DEVICES
as fairring sets it over TCP for a rank of rail 0 ("eth0,lo": its rail's interface, and
loopback for its own machine), plus fairring's UCX_TLS and segment sizes. Rank 0 writes SIZE
bytes into rank 1's memory; the script prints what each NIC sent. Then it sets host 1's eth1
down and writes again on the same connection, and then tries to connect afresh.

    python benchmarks/nixl_lanes.py                      # rail 0's devices: all on eth0
    python benchmarks/nixl_lanes.py --devices eth0,eth1  # both NICs: UCX spreads the write
    python benchmarks/nixl_lanes.py --devices eth0,eth1 --ucx UCX_MAX_RNDV_RAILS=1 --ucx UCX_MAX_EAGER_RAILS=1

With --stale it asks what a rail switch would need: can a write that stalled on a NIC that went
down be stopped from landing later, once the NIC is back? Rank 0 posts a write while host 1's
eth0 is down; after 2 s each episode lets go of it one way, sets eth0 up, waits 8 s and counts
the bytes that landed in rank 1's memory.

    python benchmarks/nixl_lanes.py --stale

A fence per rail peer would need an agent per rail peer; --agents N makes N agents in this
process and prints what each costs (threads, resident memory, descriptors, time to make).

    python benchmarks/nixl_lanes.py --agents 32
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script: the checkout's root, for `benchmarks` and the in-place build.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import InitSpec, Layout, RankPool  # noqa: E402
from fairring._config import ConfigError  # noqa: E402
from fairring._nixl import UCX_SAME_HOST_EXCLUDED, UCX_TCP_SEGMENT, UCX_TCP_SEGMENTS, nixl_library  # noqa: E402
from fairring.bench.netns import NetnsCluster, netns_available  # noqa: E402

SIZE = 8 << 20
_state: dict[str, object] = {}


def start_agent() -> str:
    """This rank's agent, its memory registered and published; loads the peer's. The peer's name."""
    import torch
    import torch.distributed as dist
    from nixl_cu13._api import nixl_agent, nixl_agent_config

    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    agent = nixl_agent(f"lanes-{rank}", nixl_agent_config(backends=["UCX"]))
    memory = torch.full((SIZE,), rank + 1, dtype=torch.uint8)
    agent.register_memory(agent.get_reg_descs(memory))
    store.set(f"metadata{rank}", agent.get_agent_metadata())
    store.set(f"address{rank}", str(memory.data_ptr()))
    dist.barrier()
    _state.update(agent=agent, memory=memory, store=store, peer=1 - rank)
    _state["peer_name"] = agent.add_remote_agent(store.get(f"metadata{1 - rank}"))
    return str(_state["peer_name"])


def write(timeout_s: float) -> str:
    """On rank 0: one write of SIZE bytes into rank 1's memory; how it ended and when."""
    import torch.distributed as dist

    if dist.get_rank() != 0:
        return ""
    start = time.monotonic()
    state = post_write()
    agent, handle = _state["agent"], _state["request"]
    while state not in ("DONE", "ERR") and time.monotonic() - start < timeout_s:
        time.sleep(0.001)
        state = agent.check_xfer_state(handle)
    took = time.monotonic() - start
    return f"still in progress after {took:.1f} s" if state not in ("DONE", "ERR") else f"{state} in {took:.3f} s"


def connect_again() -> str:
    """Drops the peer's metadata and loads it again: a fresh UCX endpoint. "" or why it failed."""
    agent = _state["agent"]
    agent.remove_remote_agent(_state["peer_name"])
    try:
        _state["peer_name"] = agent.add_remote_agent(_state["store"].get(f"metadata{_state['peer']}"))
    except Exception as error:  # NIXL's error, reported as the finding
        return f"{type(error).__name__}: {error}"
    return ""


def post_write() -> str:
    """On rank 0: posts one write of SIZE bytes into rank 1's memory and keeps its request; its state."""
    import torch.distributed as dist

    if dist.get_rank() != 0:
        return ""
    agent = _state["agent"]
    local = agent.get_xfer_descs(_state["memory"])
    remote = agent.get_xfer_descs([(int(_state["store"].get("address1")), SIZE, 0)], "DRAM")
    _state["request"] = agent.initialize_xfer("WRITE", local, remote, _state["peer_name"], b"lanes")
    return agent.transfer(_state["request"])


def let_go(how: str) -> str:
    """Lets go of the stalled write: "drop" (both forget the peer, the sender its request), or destroys an agent."""
    import gc

    import torch.distributed as dist

    rank = dist.get_rank()
    agent = _state["agent"]
    if how == "drop":
        if rank == 0:
            agent.release_xfer_handle(_state.pop("request"))
        agent.remove_remote_agent(_state["peer_name"])
    elif (how == "sender" and rank == 0) or (how == "receiver" and rank == 1):
        _state.pop("request", None)
        del agent
        _state["agent"] = None
        gc.collect()
    return ""


def landed() -> int:
    """On rank 1: how many bytes of rank 0's write are in its memory."""
    import torch.distributed as dist

    return int((_state["memory"] == 1).sum()) if dist.get_rank() == 1 else 0


def process_usage() -> tuple[int, float, int]:
    """This process's threads, resident MiB and open descriptors."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    threads = int(status["Threads"])
    resident = int(status["VmRSS"].split()[0]) / 1024
    return threads, resident, len(list(Path("/proc/self/fd").iterdir()))


def agent_costs(count: int, env: dict[str, str]) -> None:
    """Makes `count` UCX agents in this process: what each adds."""
    import os

    os.environ.update(env | {"UCX_NET_DEVICES": "lo"})
    from nixl_cu13._api import nixl_agent, nixl_agent_config

    nixl_agent("warm-up", nixl_agent_config(backends=["UCX"]))  # loads the libraries once
    threads, resident, descriptors = process_usage()
    started = time.monotonic()
    agents = [nixl_agent(f"cost-{index}", nixl_agent_config(backends=["UCX"])) for index in range(count)]
    took = time.monotonic() - started
    now = process_usage()
    print(
        f"{len(agents)} agents, each: {(now[0] - threads) / count:.1f} thread(s), "
        f"{(now[1] - resident) / count:.2f} MiB resident, {(now[2] - descriptors) / count:.1f} descriptors, "
        f"{took / count * 1000:.0f} ms to make"
    )


STALE_EPISODES = {
    "drop": "both sides dropped each other's metadata, the sender released its request",
    "sender": "the sender destroyed its agent",
    "receiver": "the receiver destroyed its agent",
}


def stale_writes(env: dict[str, str]) -> None:
    """One fresh pair of hosts per episode: how many bytes of a write stalled on a downed NIC land later."""
    for how, what in STALE_EPISODES.items():
        with NetnsCluster(2, networks=2) as cluster:
            address = cluster.hosts[0].addresses[1]  # the store on eth1, which stays up
            spec = InitSpec(method="tcp", host=address, port=29512, backend="gloo", timeout=timedelta(seconds=60))
            with RankPool(Layout(2, 1), spec=spec, hosts=cluster.hosts, rank_env={0: env, 1: env}) as ranks:
                ranks.run(start_agent)
                cluster.set_link(cluster.hosts[1], "eth0", up=False)
                ranks.run(post_write)
                time.sleep(2)
                ranks.run(let_go, how)
                cluster.set_link(cluster.hosts[1], "eth0", up=True)
                time.sleep(8)
                print(f"{what}: {ranks.run(landed)[1]:,} of {SIZE:,} bytes landed after eth0 came back", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="eth0,lo", help="UCX_NET_DEVICES on both hosts")
    parser.add_argument("--ucx", action="append", default=[], help="more UCX settings, NAME=VALUE")
    parser.add_argument("--stale", action="store_true", help="whether a stalled write lands once its NIC is back")
    parser.add_argument("--agents", type=int, default=0, help="make this many agents here: what each costs")
    args = parser.parse_args()
    try:
        nixl_library()
    except ConfigError as error:
        print(f"skipped: NIXL is not usable here: {error}")
        return 0
    env = {"UCX_TLS": UCX_SAME_HOST_EXCLUDED, "UCX_NET_DEVICES": args.devices}
    env |= {variable: UCX_TCP_SEGMENT for variable in UCX_TCP_SEGMENTS}
    env |= dict(setting.split("=", 1) for setting in args.ucx)
    if args.agents:
        agent_costs(args.agents, env)
        return 0
    available, reason = netns_available()
    if not available:
        print(f"skipped: network namespaces unavailable: {reason}")
        return 0
    print("UCX settings on both hosts:", " ".join(f"{k}={v}" for k, v in env.items()))
    if args.stale:
        stale_writes(env)
        return 0
    with NetnsCluster(2, networks=2) as cluster:

        def sent() -> dict[str, int]:
            return {nic: cluster.counters(cluster.hosts[0], nic)[0] for nic in ("eth0", "eth1")}

        def measured(what: str, outcome: str, before: dict[str, int]) -> None:
            after = sent()
            bytes_by_nic = ", ".join(f"{nic} {after[nic] - before[nic]:,}" for nic in after)
            print(f"{what}: {outcome}; host 0 sent {bytes_by_nic} bytes", flush=True)

        address = cluster.hosts[0].address
        spec = InitSpec(method="tcp", host=address, port=29511, backend="gloo", timeout=timedelta(seconds=60))
        with RankPool(Layout(2, 1), spec=spec, hosts=cluster.hosts, rank_env={0: env, 1: env}) as ranks:
            ranks.run(start_agent)
            before = sent()
            measured(f"one write of {SIZE:,} bytes", ranks.run(write, 10.0)[0], before)
            cluster.set_link(cluster.hosts[1], "eth1", up=False)
            before = sent()
            measured("host 1's eth1 down, the same connection", ranks.run(write, 8.0, timeout=60)[0], before)
            failed = [why for why in ranks.run(connect_again, timeout=60) if why]
            print("connecting afresh:", failed[0] if failed else "connected", flush=True)
            if not failed:
                before = sent()
                measured("the fresh connection", ranks.run(write, 15.0, timeout=60)[0], before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
