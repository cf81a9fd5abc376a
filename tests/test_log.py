"""fairring's log (fairring/_log.py, csrc/log.cpp): one level for Python and C++, nothing printed twice, and
lines that name the time, the host, the pid and the rank. Each case runs in a process of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

# A one-rank group, then a line from Python and a warning and an info notice from the C++.
SCRIPT = textwrap.dedent(
    """
    import logging, sys
    if "basic" in sys.argv:
        logging.basicConfig(level=logging.INFO)  # a job's own logging, to the root logger
    import torch.distributed as dist, fairring
    from fairring import _C
    dist.init_process_group("fairring", store=dist.HashStore(), rank=0, world_size=1)
    logging.getLogger("fairring").warning("python probe")
    _C._testing.log(2, "fairring: cpp warning probe")
    _C._testing.log(1, "fairring: cpp info probe")
    dist.destroy_process_group()
    """
)
# As NCCL's lines name host, pid and rank, with the time first.
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+:\d+ \[rank 0\] fairring (WARNING|INFO): (.*)$")


def run(env: dict[str, str], *args: str) -> list[str]:
    clean = {name: value for name, value in os.environ.items() if not name.startswith(("FAIRRING_", "TORCH_CPP"))}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    )
    return [line for line in done.stderr.splitlines() if "probe" in line]


@pytest.mark.timeout(120)
def test_with_the_jobs_own_logging_each_line_prints_once_naming_rank_and_time() -> None:
    lines = run({"FAIRRING_LOG_LEVEL": "INFO"}, "basic")
    assert [LINE.match(line) is not None for line in lines] == [True, True, True], lines
    assert [LINE.match(line).group(2) for line in lines if LINE.match(line)] == [
        "python probe",
        "cpp warning probe",
        "cpp info probe",
    ]


@pytest.mark.timeout(120)
def test_fairring_log_level_governs_the_cpp_notices_too() -> None:
    assert run({"FAIRRING_LOG_LEVEL": "ERROR"}) == []
    lines = run({"FAIRRING_LOG_LEVEL": "WARN"})  # NCCL_DEBUG's spelling
    assert [LINE.match(line).group(2) for line in lines if LINE.match(line)] == ["python probe", "cpp warning probe"]


@pytest.mark.timeout(120)
def test_unset_the_cpp_notices_follow_torch_cpp_log_level_as_nccls_do() -> None:
    # c10's own lines ([rank0]:[W... file:line] text), which TORCH_CPP_LOG_LEVEL governs for NCCL's and Gloo's.
    lines = run({})
    assert len(lines) == 2 and LINE.match(lines[0]) and "python probe" in lines[0], lines
    assert lines[1].startswith("[rank0]:[W") and lines[1].endswith("fairring: cpp warning probe"), lines
    lines = run({"TORCH_CPP_LOG_LEVEL": "INFO"})
    assert len(lines) == 3, lines
    assert lines[1].endswith("cpp warning probe") and lines[2].endswith("cpp info probe"), lines
    lines = run({"TORCH_CPP_LOG_LEVEL": "ERROR"})
    assert len(lines) == 1 and "python probe" in lines[0], lines
