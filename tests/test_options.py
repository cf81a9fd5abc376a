"""A group's pg_options (fairring/_options.py): fairring.Options over the environment's settings, checked, and
an NCCL job's options kept. No processes, no sockets."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from fairring._config import load_config
from fairring._errors import ConfigError
from fairring._options import Options, group_options, nccl_options


def test_group_options_over_the_variables() -> None:
    env = load_config({"FAIRRING_CUDA_ENGINE": "0", "FAIRRING_FLAT_THRESHOLD": "1MiB"})
    assert env.with_group_options(None, None) == env
    on = env.with_group_options(True, 0)
    assert on.cuda_engine and on.cpu_flat_threshold == on.cuda_flat_threshold == 0 and not on.engine_off
    off = load_config({"FAIRRING_CUDA_ENGINE": "1"}).with_group_options(False, None)
    assert off.engine_off and not off.cuda_engine
    # No all-reduce is as large as the threshold of a group kept off the engine.
    assert off.cpu_flat_threshold == off.cuda_flat_threshold == 2**63 - 1
    # Ranks compare the switch itself, named as the user sets it.
    assert off.must_agree()["fairring.Options.engine"] != on.must_agree()["fairring.Options.engine"]
    assert env.must_agree()["fairring.Options.engine"] == "unset"


def test_the_rollback_switch_wins_over_a_groups_options() -> None:
    """FAIRRING_ENGINE_DISABLE=1 keeps a group that asked for the engine off it, CPU and CUDA alike."""
    disabled = load_config({"FAIRRING_ENGINE_DISABLE": "1", "FAIRRING_CUDA_ENGINE": "auto"})
    for engine, threshold in ((True, 0), (None, "auto"), (None, None)):
        config = disabled.with_group_options(engine, threshold)
        assert config.engine_off and not config.cuda_engine, (engine, threshold)
        assert config.cpu_flat_threshold == config.cuda_flat_threshold == 2**63 - 1
    # Negative control: without it, the group's options put it on the engine.
    assert not load_config({}).with_group_options(True, 0).engine_off
    # Every rank must agree on it, as on the group's own switch.
    assert disabled.must_agree()["FAIRRING_ENGINE_DISABLE"] != load_config({}).must_agree()["FAIRRING_ENGINE_DISABLE"]


def test_pg_options_are_checked_and_an_nccl_jobs_options_are_kept() -> None:
    assert group_options(None) == Options()
    mine = Options(engine=False, flat_threshold=4096)
    assert Options(flat_threshold="auto").flat_threshold == "auto"
    assert group_options(mine) is mine
    with pytest.raises(TypeError, match=r"pass fairring.Options\(engine=..., flat_threshold=..., nccl=...\)"):
        group_options(object())
    with pytest.raises(TypeError, match="flat_threshold must be a byte count"):
        Options(flat_threshold=-1)
    with pytest.raises(TypeError, match="engine must be None, True or False"):
        Options(engine="yes")  # type: ignore[arg-type]
    # 0 == False and 1 == True, but only bools mean off and on: engine=0 once left the engine on.
    for number in (0, 1):
        with pytest.raises(TypeError, match="engine must be None, True or False, not " + str(number)):
            Options(engine=number)  # type: ignore[arg-type]
    # flat_threshold takes the sizes FAIRRING_FLAT_THRESHOLD takes.
    assert Options(flat_threshold="4MiB").flat_threshold == 4 << 20
    assert Options(flat_threshold="0").flat_threshold == 0
    with pytest.raises(ConfigError, match=r"fairring.Options.flat_threshold='4 parsecs' is not a size"):
        Options(flat_threshold="4 parsecs")
    nccl_type = getattr(getattr(dist, "ProcessGroupNCCL", None), "Options", None)
    if nccl_type is None:
        pytest.skip(f"torch {torch.__version__} has no ProcessGroupNCCL: an NCCL job's options cannot exist")
    user = nccl_type(is_high_priority_stream=True)
    user.config.max_ctas = 7
    assert group_options(user).nccl is user
    made = nccl_options(user, timedelta(seconds=42))
    assert made is not user and made.is_high_priority_stream and made.config.max_ctas == 7
    assert made._timeout == timedelta(seconds=42)
    user.config.max_ctas = 9  # copied by value: later edits to the user's object stay theirs
    assert made.config.max_ctas == 7
    assert not nccl_options(None, timedelta(seconds=1)).is_high_priority_stream
