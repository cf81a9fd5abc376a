"""A build without TensorPipe (FAIRRING_WITH_TENSORPIPE=0, as where torch has none) builds, imports, runs on NIXL.

The extension is built a second time, out of tree but from the in-place build's objects, and two
ranks as two machines all-reduce over the NIXL rails, checked against plain torch.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairring.bench import free_port
from nixl_support import needs_nixl

ROOT = Path(__file__).resolve().parents[1]
CCACHE_CXX = Path("/usr/lib/ccache/g++")

# What the build says of itself and how it configures the rails, as JSON.
FACTS = textwrap.dedent(
    """
    import json
    import fairring
    from fairring._config import ConfigError, load_config

    endpoint = hasattr(fairring._C._testing, "RailsEndpoint")
    facts = {"tensorpipe": fairring.build_info()["tensorpipe"], "endpoint": endpoint}
    facts["default"] = load_config({}).rails_transport
    try:
        load_config({"FAIRRING_RAILS_TRANSPORT": "tensorpipe"})
        facts["refusal"] = ""
    except ConfigError as error:
        facts["refusal"] = str(error)
    print(json.dumps(facts))
    """
)
# One rank of two: sums of several sizes, each checked against torch's own sum of both ranks' inputs.
RANK = textwrap.dedent(
    """
    import sys
    import torch, torch.distributed as dist
    import fairring

    rank, port = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("fairring", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    for numel in (1, 1001, 300_001, 2_000_003):
        inputs = [torch.arange(numel, dtype=torch.int64) * (r + 1) + r for r in range(2)]
        tensor = inputs[rank].clone()
        dist.all_reduce(tensor)
        print(f"numel {numel}:", "correct" if torch.equal(tensor, inputs[0] + inputs[1]) else "WRONG", flush=True)
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def build_without_tensorpipe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The package with an extension built with FAIRRING_WITH_TENSORPIPE=0."""
    lib = tmp_path_factory.mktemp("no-tensorpipe")
    shutil.copytree(ROOT / "fairring", lib / "fairring", ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    env = dict(os.environ, FAIRRING_WITH_TENSORPIPE="0", MAX_JOBS=os.environ.get("MAX_JOBS", "2"))
    if CCACHE_CXX.exists():
        env["CXX"] = str(CCACHE_CXX)
    # The in-place build's objects (its default --build-temp) serve this one too: only the sources
    # that differ compile, and `make build` afterwards finds its objects unchanged.
    command = [sys.executable, "setup.py", "--quiet", "build_ext", "--build-lib", str(lib)]
    built = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-6000:]
    assert "building without the TensorPipe rails" in built.stdout, built.stdout
    yield lib


def run_ranks(lib: Path) -> list[str]:
    """Two ranks as two machines on loopback, importing fairring from `lib`; each rank's output."""
    port = free_port()
    ranks = []
    for rank in range(2):
        env = dict(
            os.environ,
            PYTHONPATH=str(lib),
            FAIRRING_MACHINE_ID=f"machine-{rank}",
            FAIRRING_SOCKET_IFNAME="lo",
            GLOO_SOCKET_IFNAME="lo",
            FAIRRING_FLAT_THRESHOLD="0",
            FAIRRING_LOG_LEVEL="INFO",
            MALLOC_ARENA_MAX="2",
        )
        env.pop("FAIRRING_RAILS_TRANSPORT", None)  # the build's default is what is tested
        command = [sys.executable, "-c", RANK, str(rank), str(port)]
        ranks.append(
            subprocess.Popen(command, cwd=lib, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outputs = []
    try:
        for process in ranks:
            outputs.append(process.communicate(timeout=120)[0])
    finally:
        for process in ranks:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()
    for rank, (process, output) in enumerate(zip(ranks, outputs, strict=True)):
        assert process.returncode == 0, f"rank {rank}:\n{output[-4000:]}"
    return outputs


@pytest.mark.timeout(1200)
def test_a_build_without_tensorpipe_imports_and_defaults_to_nixl(build_without_tensorpipe: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", FACTS], cwd=build_without_tensorpipe, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(build_without_tensorpipe)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    facts = json.loads(run.stdout.strip().splitlines()[-1])
    assert facts["tensorpipe"] is False and facts["endpoint"] is False, facts
    assert facts["default"] == "nixl", facts
    assert "built without TensorPipe" in facts["refusal"] and "FAIRRING_RAILS_TRANSPORT=nixl" in facts["refusal"]


@needs_nixl
def test_a_build_without_tensorpipe_all_reduces_over_nixl(build_without_tensorpipe: Path) -> None:
    for output in run_ranks(build_without_tensorpipe):
        assert "NIXL UCX" in output, output[-4000:]  # the rails' INFO line: NIXL carried them
        checked = [line for line in output.splitlines() if line.startswith("numel ")]
        assert len(checked) == 4 and all(line.endswith("correct") for line in checked), output[-4000:]
