"""What the extension was built with, and the version the package says it is."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

import fairring


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
