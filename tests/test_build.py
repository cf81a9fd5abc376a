"""What the extension was built with, and the version the package says it is."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fairring
from fairring._config import load_config
from fairring._registration import check_cuda_path


def test_build_info_matches_running_torch() -> None:
    info = fairring.build_info()
    assert info["torch"] == torch.__version__.split("+")[0]
    assert info["cxx_standard"] >= 202002


def test_cuda_path_is_built_when_required() -> None:
    # CI builds with FAIRRING_WITH_CUDA=1; this catches an extension that
    # silently lost its CUDA path.
    if os.environ.get("FAIRRING_WITH_CUDA") != "1":
        pytest.skip("FAIRRING_WITH_CUDA is not 1, so a CPU-only build is allowed")
    info = fairring.build_info()
    assert info["cuda_path"] is True
    assert info["cuda"] == torch.version.cuda
    assert info["nccl"] == ".".join(map(str, torch.cuda.nccl.version()))


def test_backend_name_is_registered() -> None:
    import torch.distributed as dist

    assert dist.Backend.FAIRRING == "fairring"
    assert "FAIRRING" in dist.Backend._plugins


def test_the_version_is_the_one_setup_py_reads() -> None:
    # fairring/_version.py is the one place the version is written (docs/configuration.md); setup.py reads
    # the file's text rather than importing the package, and gives that to the wheel.
    namespace: dict[str, object] = {}
    exec((Path(__file__).resolve().parents[1] / "fairring" / "_version.py").read_text(), namespace)
    assert fairring.__version__ == namespace["__version__"]
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", fairring.__version__)


def test_build_info_names_fairrings_own_version() -> None:
    # Records that keep build_info() (the bench's, fairring.validate's) then say which fairring ran.
    assert fairring.build_info()["fairring"] == fairring.__version__


@pytest.mark.parametrize(
    ("env", "fails"),
    [
        ({"FAIRRING_CUDA_ENGINE": "1"}, True),
        ({"FAIRRING_CUDA_ENGINE": "on"}, True),
        ({"FAIRRING_CUDA_ENGINE": "auto"}, True),  # the engine on, measured: it could not run
        ({}, False),  # the default: CUDA tensors go to NCCL, as they would anyway
        ({"FAIRRING_CUDA_ENGINE": "0"}, False),
        ({"FAIRRING_CUDA_ENGINE": "1", "FAIRRING_ENGINE_DISABLE": "1"}, False),  # the rollback needs no rebuild
    ],
    ids=["1", "on", "auto", "unset", "0", "engine-disabled"],
)
def test_the_cuda_engine_asked_of_a_build_without_its_cuda_path_fails_init(env: dict[str, str], fails: bool) -> None:

    env_config = load_config(env)
    group = env_config.with_group_options(None, None)
    if fails:
        setting = "auto" if env["FAIRRING_CUDA_ENGINE"] == "auto" else "1"
        with pytest.raises(fairring.ConfigError) as caught:
            check_cuda_path(env_config, group, cuda_path=False, torch_cuda=True)
        message = str(caught.value)
        assert message.startswith(f"FAIRRING_CUDA_ENGINE={setting} asks for the CUDA engine, but this fairring was")
        assert "built without its CUDA path" in message
        assert "`FAIRRING_WITH_CUDA=1 pip install --no-build-isolation .`" in message
    else:
        check_cuda_path(env_config, group, cuda_path=False, torch_cuda=True)
    # A group kept off the engine, a build with the path, or a torch without CUDA: nothing to say.
    check_cuda_path(env_config, env_config.with_group_options(False, None), cuda_path=False, torch_cuda=True)
    check_cuda_path(env_config, group, cuda_path=True, torch_cuda=True)
    check_cuda_path(env_config, group, cuda_path=False, torch_cuda=False)


def test_a_groups_engine_true_alone_is_not_refused_at_init() -> None:
    # Options(engine=True) serves CPU tensors too (fairring.validate's engine path on --device cpu); its first
    # CUDA all-reduce on the engine fails with the rebuild advice (device/cuda_none.cpp).

    env_config = load_config({})
    check_cuda_path(env_config, env_config.with_group_options(True, 0), cuda_path=False, torch_cuda=True)


# The extension, made to say it was built without its CUDA path; then `import fairring` and a group's init
# under FAIRRING_CUDA_ENGINE=1, as JSON.
WITHOUT_CUDA_PATH = textwrap.dedent(
    """
    import importlib.machinery, importlib.util, json, os, sys, types, warnings
    from datetime import timedelta
    import torch, torch.distributed as dist

    package = importlib.util.find_spec("fairring").submodule_search_locations[0]
    origin = importlib.machinery.PathFinder.find_spec("_C", [package]).origin
    spec = importlib.util.spec_from_file_location("fairring._C", origin)
    real = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real)

    class WithoutCudaPath(types.ModuleType):
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def build_info():
            return {**real.build_info(), "cuda_path": False, "cuda": ""}

    sys.modules["fairring._C"] = WithoutCudaPath("fairring._C")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import fairring
    from fairring._registration import create_backend

    torch.version.cuda = torch.version.cuda or "13.0"  # the users concerned: a CUDA torch
    os.environ["FAIRRING_CUDA_ENGINE"] = "1"
    try:
        create_backend(dist.HashStore(), 0, 1, timedelta(seconds=10), "test")
        refusal = None
    except Exception as error:
        refusal = f"{type(error).__name__}: {error}"
    facts = {"cuda_path": fairring.build_info()["cuda_path"], "refusal": refusal}
    print(json.dumps({**facts, "warnings": [str(warning.message) for warning in caught]}))
    """
)


@pytest.mark.timeout(60)
def test_a_build_without_its_cuda_path_imports_silently_and_refuses_the_cuda_engine_at_init() -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("FAIRRING_")}
    # The checkout's fairring, as the test process imports it.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(fairring.__file__).parents[1]), env.get("PYTHONPATH")]))
    # Run from there too: `python -c` puts its working directory first, where a checkout's fairring would
    # shadow the one under test (make test-oldest imports an out-of-tree build).
    finished = subprocess.run(
        [sys.executable, "-c", WITHOUT_CUDA_PATH],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(fairring.__file__).parents[1],
        timeout=50,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    facts = json.loads(finished.stdout.strip().splitlines()[-1])
    assert facts["cuda_path"] is False
    # The engine is off by default: importing says nothing, on every rank of every job.
    assert not [text for text in facts["warnings"] if "fairring" in text], facts["warnings"]
    assert (facts["refusal"] or "").startswith("ConfigError: FAIRRING_CUDA_ENGINE=1 asks for the CUDA engine"), facts
