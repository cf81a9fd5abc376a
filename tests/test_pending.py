"""fairring.pending() and FAIRRING_DUMP_SIGNAL: what a rank's engine ops wait on, before any timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch
import torch.distributed as dist

import fairring
from benchmarks.harness import Layout, RankPool
from fairring._config import ConfigError, parse_dump_signal

LATE_S = 4.0  # how long rank 1 keeps rank 0 waiting


def one_late_all_reduce(report_file: str) -> dict[str, object]:
    """Rank 1 joins the second all-reduce late; meanwhile rank 0 asks what is pending, both ways."""
    tensor = torch.ones(1 << 16)
    dist.all_reduce(tensor)  # the engine is made, collectively, by the first
    seen: dict[str, object] = {}
    if dist.get_rank() == 1:
        time.sleep(LATE_S)
    else:
        # As FAIRRING_DUMP_SIGNAL=USR2 does at import (test_the_dump_signal_reaches_import below).
        fairring._C.report_pending_on_signal(signal.SIGUSR2)
        # fd 2 to a file, so that what the C++ thread writes there can be read back.
        saved = os.dup(2)
        with open(report_file, "w") as report:
            os.dup2(report.fileno(), 2)

        def look() -> None:
            time.sleep(LATE_S / 2)
            seen["call"] = fairring.pending()
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.5)

        looker = threading.Thread(target=look)
        looker.start()
        # The main thread is blocked here, in the engine's wait, throughout.
        dist.all_reduce(tensor)
        looker.join()
        os.dup2(saved, 2)
        os.close(saved)
        seen["after"] = fairring.pending()
        with open(report_file) as report:
            seen["signal"] = report.read()
        return seen
    dist.all_reduce(tensor)
    return seen


@pytest.mark.timeout(120)
def test_pending_names_the_op_its_stage_and_the_rank_it_awaits() -> None:
    layout = Layout(2, 1)
    with tempfile.NamedTemporaryFile(suffix=".txt") as report:
        with RankPool(layout) as pool:
            seen = pool.run(one_late_all_reduce, report.name, timeout=90)[0]
    [line] = seen["call"]
    assert "all_reduce #" in line and "65536 x Float, sum" in line and "cpu" in line, line
    assert "awaits rank(s) 1" in line and "rail peer rank(s) 1" in line, line
    assert "issued " in line and "ms ago" in line, line
    # The signal's report, written by fairring's thread while the main thread waited.
    assert "pending: \n" in seen["signal"] and "awaits rank(s) 1" in seen["signal"], seen["signal"]
    assert seen["after"] == [], seen["after"]


def test_dump_signal_is_checked() -> None:
    assert parse_dump_signal(None) is None and parse_dump_signal("") is None
    assert parse_dump_signal("usr2") == parse_dump_signal("SIGUSR2") == signal.SIGUSR2
    assert parse_dump_signal("USR1") == signal.SIGUSR1
    for bad in ("TERM", "INT", "KILL", "12", "banana"):
        with pytest.raises(ConfigError, match=r"FAIRRING_DUMP_SIGNAL=.* use USR1 or USR2"):
            parse_dump_signal(bad)


SIGNAL_ITSELF = "import os, signal, time, fairring; os.kill(os.getpid(), signal.SIGUSR2); time.sleep(1); print('alive')"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting", ["USR2", None], ids=["set", "negative_control"])
def test_the_dump_signal_reaches_import(setting: str | None) -> None:
    """Set, the signal prints a report and the process lives on; unset, SIGUSR2 ends it, as by default."""
    env = {k: v for k, v in os.environ.items() if k != "FAIRRING_DUMP_SIGNAL"}
    if setting is not None:
        env["FAIRRING_DUMP_SIGNAL"] = setting
    done = subprocess.run([sys.executable, "-c", SIGNAL_ITSELF], env=env, capture_output=True, text=True, timeout=100)
    if setting is None:
        assert done.returncode == -signal.SIGUSR2, (done.returncode, done.stderr)
        return
    assert done.returncode == 0 and done.stdout.strip() == "alive", done.stderr
    assert "pending: no engine op is pending" in done.stderr, done.stderr
