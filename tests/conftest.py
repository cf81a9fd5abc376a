from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# The checkout's root, for the helpers the tests share with benchmarks/ (benchmarks.harness: ranks as
# processes). Last on the path: where pytest's pythonpath is a build folder (make sanitize, make
# test-oldest), that folder's fairring stays the one imported.
if str(Path(__file__).parents[1]) not in sys.path:
    sys.path.append(str(Path(__file__).parents[1]))

from benchmarks.harness import Layout, RankPool, start_fork_server

# Tiers by marker, each test's time budget, and the slowest tests listed at the end.
pytest_plugins = ("tiers",)


@pytest.fixture(autouse=True)
def fairring_log_reaches_caplog() -> Iterator[None]:
    """fairring's logger does not propagate (fairring/_log.py); pytest's caplog listens at the root."""
    import logging

    logger = logging.getLogger("fairring")
    propagated = logger.propagate
    logger.propagate = True
    yield
    logger.propagate = propagated


@pytest.fixture(scope="session", autouse=True)
def flight_recorder_dumps() -> Iterator[Path]:
    """Where ranks' flight-recorder dumps go: a directory removed after the run.

    torch dumps each rank's trace when a collective fails (TORCH_FR_DUMP_ON_TIMEOUT
    is on by default), to /tmp/nccl_trace_rank_<rank> unless told otherwise; the
    failure tests would leave those behind. Every process the tests start
    inherits this.
    """
    directory = Path(tempfile.mkdtemp(prefix="fairring-fr-"))
    # Without stack traces: symbolizing them makes each dump take seconds under the
    # sanitizers, and destroy_process_group waits for it, which failure tests time.
    settings = {"TORCH_FR_DUMP_TEMP_FILE": str(directory / "trace_rank_"), "TORCH_INCLUDE_STACK_TRACE": "0"}
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    yield directory
    for name, value in previous.items():
        if value is None:
            del os.environ[name]
        else:
            os.environ[name] = value
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def temporary_files_of_started_processes() -> Iterator[Path]:
    """TMPDIR for every process the tests start: a directory removed after the run.

    torchrun's agents make a torchelastic_* log directory there and never remove it;
    a test that kills a process leaves what it had open there too.
    """
    directory = Path(tempfile.mkdtemp(prefix="fairring-tests-tmp-"))
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(directory)
    yield directory
    if previous is None:
        del os.environ["TMPDIR"]
    else:
        os.environ["TMPDIR"] = previous
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def fork_server(flight_recorder_dumps: Path, temporary_files_of_started_processes: Path) -> None:
    """The server the harness forks ranks from, started with the session's environment, before any test
    changes it."""
    start_fork_server()


# Machine layouts every collective test runs on. The 3x2 layout interleaves
# machines (rank r on machine r % 3), so nothing may assume machine-major order.
LAYOUTS = [
    Layout(machines=1, ranks_per_machine=2),
    Layout(machines=1, ranks_per_machine=4),
    Layout(machines=2, ranks_per_machine=2),
    Layout(machines=4, ranks_per_machine=1),
    Layout(machines=3, ranks_per_machine=2, interleaved=True),
    Layout(machines=2, ranks_per_machine=3),
]


@pytest.fixture(scope="session", params=LAYOUTS, ids=str)
def pool(request: pytest.FixtureRequest) -> Iterator[RankPool]:
    """A process group of real ranks on one layout, shared by the tests of that layout.

    Session scope with parameters makes pytest run all tests of one layout
    together, so only one pool is alive at a time.
    """
    with RankPool(request.param) as ranks:
        yield ranks
