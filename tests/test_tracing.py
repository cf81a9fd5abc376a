"""Where an op's time goes: torch.profiler ranges and the FAIRRING_TIMELINE trace."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from benchmarks.harness import Layout, RankPool
from benchmarks.reference import assert_matches, rank_tensor, reduce_reference

LAYOUT = Layout(2, 2)
STAGES = ("reduce-scatter", "reduce", "all-gather")


@pytest.fixture(scope="module")
def ranks() -> Iterator[RankPool]:
    with RankPool(LAYOUT) as pool:
        yield pool


def checked_all_reduce(numel: int, group: dist.ProcessGroup | None = None) -> None:
    tensor = rank_tensor(dist.get_rank(), (numel,), torch.float32)
    dist.all_reduce(tensor, group=group)
    expected = reduce_reference([rank_tensor(r, (numel,), torch.float32) for r in range(dist.get_world_size())], "sum")
    assert_matches(tensor, expected)


def profiled_names() -> list[str]:
    checked_all_reduce(1000)  # the engine exists before profiling starts
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        checked_all_reduce(3 * 1024 * 1024)  # 12 MiB: several slices
    return sorted({event.name for event in profile.events() if event.name.startswith("fairring:")})


def test_profiler_shows_the_op_and_its_stages(ranks: RankPool) -> None:
    expected = ["fairring:all_gather", "fairring:all_reduce", "fairring:reduce", "fairring:reduce_scatter"]
    assert ranks.run(profiled_names) == [expected] * LAYOUT.world_size


def timeline_of_one_group(folder: str) -> str:
    os.environ["FAIRRING_TIMELINE"] = folder
    try:
        group = dist.new_group(backend="fairring")
    finally:
        del os.environ["FAIRRING_TIMELINE"]
    checked_all_reduce(1000, group)
    checked_all_reduce(3 * 1024 * 1024, group)
    name = group.group_name
    dist.destroy_process_group(group)  # closes the files
    return name


def load_trace(path: Path) -> list[dict]:
    return json.loads(path.read_text())


def test_timeline_has_every_slice_stage_on_every_rank(ranks: RankPool, tmp_path: Path) -> None:
    names = ranks.run(timeline_of_one_group, str(tmp_path))
    assert len(set(names)) == 1
    files = sorted(tmp_path.glob("fairring-*.json"))
    assert [f.name for f in files] == [f"fairring-{names[0]}-rank{r}-cpu.json" for r in range(LAYOUT.world_size)]
    for rank, path in enumerate(files):
        events = load_trace(path)
        spans = [e for e in events if e["ph"] == "X"]
        # op 0: 1000 floats, one slice; op 1: 12 MiB in several slices, each through every stage once.
        assert Counter((e["args"]["op"], e["name"]) for e in spans if e["args"]["op"] == 0) == {
            (0, stage): 1 for stage in STAGES
        }
        count = sum(1 for e in spans if e["args"]["op"] == 1 and e["tid"] == 0)
        assert count > 1
        for stage in STAGES:
            indices = sorted(e["args"]["slice"] for e in spans if e["args"]["op"] == 1 and e["name"] == stage)
            assert indices == list(range(count)), (stage, indices)
            assert sum(e["args"]["bytes"] for e in spans if e["args"]["op"] == 1 and e["name"] == stage) == 12 * 2**20
        assert all(e["pid"] == rank and e["tid"] == STAGES.index(e["name"]) for e in spans)
        # Each slice's stages run in order.
        for index in range(count):
            start = {e["name"]: e["ts"] for e in spans if e["args"]["op"] == 1 and e["args"]["slice"] == index}
            assert start["reduce-scatter"] <= start["reduce"] <= start["all-gather"], start
        names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
        assert names == set(STAGES)
