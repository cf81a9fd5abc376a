"""What a user meets before any collective runs: the package's metadata and extras, the build's error
where torch cannot be imported, and the two commands' flags (nccl-tests' names in both).

Pure checks, except the build's error, which runs setup.py as a build front end would, with torch hidden.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
SETUP = ROOT / "setup.py"
# The flags the two commands share, as nccl-tests spells them: short, long.
SHARED_FLAGS = [("-b", "--minbytes"), ("-e", "--maxbytes"), ("-f", "--stepfactor"), ("-n", "--iters")]
SHARED_FLAGS += [("-w", "--warmup_iters")]
# The bench's names before, kept one release: old -> new.
BENCH_OLD_NAMES = {
    "--begin": "--minbytes",
    "--end": "--maxbytes",
    "--factor": "--stepfactor",
    "--warmup": "--warmup_iters",
    "--timeout": "--time-limit",
}
# setup() keywords by the [project] field they fill.
SETUP_KEYWORDS = {
    "name": "name",
    "version": "version",
    "description": "description",
    "license": "license",
    "install_requires": "dependencies",
    "extras_require": "optional-dependencies",
    "python_requires": "requires-python",
    "entry_points": "entry-points",
    "classifiers": "classifiers",
    "url": "urls",
    "project_urls": "urls",
    "long_description": "readme",
    "author": "authors",
}


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())["project"]


# --- the metadata --------------------------------------------------------------------------


def test_pyproject_holds_the_projects_metadata(project: dict[str, Any]) -> None:
    assert project["name"] == "torch-fairring"
    assert project["readme"] == "README.md" and (ROOT / project["readme"]).is_file()
    assert project["requires-python"] == ">=3.10"
    assert project["description"] and project["authors"] and project["keywords"]
    classifiers = project["classifiers"]
    assert "Programming Language :: Python :: 3" in classifiers
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    assert any(c.startswith("Operating System :: ") for c in classifiers)
    # PEP 639: setuptools >= 77 deprecates license classifiers (and refuses them next to a license expression).
    assert not [c for c in classifiers if c.startswith("License :: ")]
    # No public repository address exists yet: none is made up, and any given must be one.
    assert all(url.startswith("https://") for url in project.get("urls", {}).values())
    assert project["entry-points"]["torch.distributed.backends"] == {"fairring": "fairring._registration:register"}
    # setup.py computes these: the version (read, not imported), torch pinned to the build's, the license.
    assert set(project["dynamic"]) == {"version", "dependencies", "license"}


def test_pyproject_is_valid_for_setuptools() -> None:
    pyprojecttoml = pytest.importorskip("setuptools.config.pyprojecttoml")
    assert pyprojecttoml.validate(tomllib.loads(PYPROJECT.read_text()), str(PYPROJECT))


def setup_keywords() -> set[str]:
    """The keywords of setup.py's setup() call."""
    calls = [
        node
        for node in ast.walk(ast.parse(SETUP.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setup"
    ]
    assert len(calls) == 1, "setup.py calls setup() once"
    return {keyword.arg for keyword in calls[0].keywords if keyword.arg}


def test_setup_py_gives_only_the_dynamic_fields(project: dict[str, Any]) -> None:
    # setuptools ignores (with a warning) what setup() gives for a field pyproject.toml declares statically.
    given = {SETUP_KEYWORDS[k] for k in setup_keywords() if k in SETUP_KEYWORDS}
    assert given == set(project["dynamic"])


def test_the_bench_extra_holds_what_the_package_imports(project: dict[str, Any]) -> None:
    extras = project["optional-dependencies"]
    assert extras["nixl"] == ["nixl-cu13>=1.4"]
    imported = set()
    for path in (ROOT / "fairring").rglob("*.py"):
        imported |= set(re.findall(r"^\s*(?:import|from) (matplotlib|numpy)\b", path.read_text(), re.M))
    assert imported == {"matplotlib", "numpy"}
    assert {re.split(r"[<>=!~ \[;]", requirement)[0] for requirement in extras["bench"]} == imported


# --- setup.py without torch ----------------------------------------------------------------

HIDDEN_TORCH = "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
BROKEN_TORCH = "raise ImportError('libtorch_cpu.so: cannot open shared object file')\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "case, expected",
    [
        # pip's legacy isolation: its overlay on sys.path. The folder is pip's own name for it.
        ("overlay", ["isolated build environment", "pip-build-env-", "pip install --no-build-isolation ."]),
        # pip's venv isolation (pip >= 26): its venv is sys.prefix.
        ("venv", ["isolated build environment", "pip-build-env-", "pip install --no-build-isolation ."]),
        ("plain", ["torch is not installed in this environment", sys.executable, "--no-build-isolation"]),
        ("broken", ["torch does not import", "libtorch_cpu.so", sys.executable]),
    ],
)
def test_setup_py_says_why_torch_cannot_be_imported(tmp_path: Path, case: str, expected: list[str]) -> None:
    shadow = tmp_path / ("pip-build-env-x1/overlay" if case == "overlay" else "site")
    shadow.mkdir(parents=True)
    (shadow / "torch.py").write_text(BROKEN_TORCH if case == "broken" else HIDDEN_TORCH)
    prefix = f"sys.prefix = {str(tmp_path / 'pip-build-env-x2')!r}; " if case == "venv" else ""
    script = f"import runpy, sys; {prefix}runpy.run_path({str(SETUP)!r}, run_name='__main__')"
    env = {**os.environ, "PYTHONPATH": str(shadow)}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=50
    )
    assert run.returncode == 1, run.stdout + run.stderr
    for words in expected:
        assert words in run.stderr, run.stderr
    if case in ("plain", "broken"):
        assert "isolated" not in run.stderr


# --- the commands' flags -------------------------------------------------------------------


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    import fairring.bench.__main__ as bench
    from fairring.validate import cli

    return {"bench": bench.build_parser(), "validate": cli.build_parser()}


def dest_of(parser: argparse.ArgumentParser, flag: str) -> str:
    """The one attribute that `flag 8` sets, against the defaults."""
    defaults, given = vars(parser.parse_args([])), vars(parser.parse_args([flag, "8"]))
    changed = [name for name, value in given.items() if value != defaults[name]]
    assert len(changed) == 1, (flag, changed)
    return changed[0]


@pytest.mark.parametrize("command", ["bench", "validate"])
def test_both_commands_take_nccl_tests_flag_names(
    parsers: dict[str, argparse.ArgumentParser], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = parsers[command]
    for short, long in SHARED_FLAGS:
        assert dest_of(parser, short) == dest_of(parser, long), (command, short, long)
    assert capsys.readouterr().err == "", "the current names are not deprecated"
    help_text = parser.format_help()
    for _, long in SHARED_FLAGS:
        assert long in help_text


@pytest.mark.parametrize("old, new", BENCH_OLD_NAMES.items())
def test_the_benchs_old_names_still_work_and_name_the_new_one(
    parsers: dict[str, argparse.ArgumentParser], capsys: pytest.CaptureFixture[str], old: str, new: str
) -> None:
    parser = parsers["bench"]
    capsys.readouterr()
    assert dest_of(parser, new) == dest_of(parser, old)
    note = capsys.readouterr().err
    assert note.count("\n") == 1 and old in note and new in note and "deprecated" in note, note


def test_timeout_is_per_collective_and_the_run_limit_named_apart(parsers: dict[str, argparse.ArgumentParser]) -> None:
    # validate's --timeout is torch's: what any one collective may take. The bench's limit on its whole run
    # has a name of its own; its --timeout is that limit's old name until the next release.
    validate_help = " ".join(parsers["validate"].format_help().split())
    assert re.search(r"--timeout S\s+seconds any one collective may take", validate_help), validate_help
    bench_help = " ".join(parsers["bench"].format_help().split())
    assert re.search(r"--time-limit S, --timeout S\s+seconds the whole run may take", bench_help), bench_help


def test_the_bench_stops_before_running_without_its_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import fairring.bench.__main__ as bench

    def ran(*_: object) -> None:
        raise AssertionError("the bench ran without matplotlib: it would fail only at plotting")

    monkeypatch.setattr(bench, "runs_for", ran)
    monkeypatch.setattr(bench, "run_training_study", ran)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: import and find_spec fail
    assert bench.main(["--loopback", "--json", str(tmp_path / "r.json"), "--plots", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "matplotlib" in error and "pip install 'torch-fairring[bench]'" in error, error
