"""The typed API (fairring/_C.pyi, fairring/types.py, fairring/py.typed).

A user's code that calls each accessor passes `mypy --strict` with the results' precise types, and a
misuse of a result fails it; the stub names what the built module has, with pybind's argument names and
defaults; and each TypedDict's keys and value types are those that real calls return, on a group whose
engine exists (two machines of one rank).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import types
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

import pytest
import torch
import torch.distributed as dist

import fairring
from benchmarks.harness import InitSpec, Layout, RankPool
from fairring import _C
from fairring.types import (
    BuildInfo,
    EngineFootprint,
    EngineStats,
    ExtensionBuildInfo,
    InterfaceAddress,
    MeasuredThreshold,
    PathChoice,
    PlanShape,
    RailsInfo,
    StagingStats,
    UsageRow,
)

REPO = Path(__file__).resolve().parents[1]
STUB = REPO / "fairring" / "_C.pyi"

# Only the public API; assert_type fails where a result is Any, so the stub's precision is what passes.
USER_SNIPPET = """
from __future__ import annotations

from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist
from typing_extensions import assert_type

import fairring
from fairring.types import (
    BuildInfo,
    EngineFootprint,
    EngineStats,
    MeasuredThreshold,
    PathChoice,
    RailsInfo,
    StagingStats,
    UsageRow,
)


def look(group: dist.ProcessGroup | None = None) -> list[str]:
    backend = fairring.backend_of(group, "cpu")
    said: list[str] = []
    stats = backend.engine_stats("cpu")
    assert_type(stats, EngineStats | None)
    if stats is not None:
        said.append(str(stats["ops"] + 1))
        assert_type(stats["local_steps_state"], Literal["running", "closed", "aborted"])
        said.append(str(stats["by_collective"]["reduce_scatter"]["bytes"] // 2))
    staging: StagingStats | None = backend.staging_stats()
    if staging is not None:
        assert_type(staging["peak_leases_in_use"], int)
    measured: MeasuredThreshold | None = backend.measured_threshold("cpu", collective="all_reduce")
    if measured is not None:
        for size in measured["sizes"]:
            assert_type(size["engine_s"] / size["delegate_s"], float)
        assert_type(measured["source"], Literal["measured", "cache"])
    for row in backend.usage():
        assert_type(row, UsageRow)
        assert_type(row["by_reason"], dict[str, int])
        for smallest, ops, nbytes in row["by_size"]:
            said.append(f"{smallest + ops + nbytes}")
        assert_type(row["busy_s"], float)
    choice = backend.path_for(1 << 20, torch.float32, device="cpu", collective="all_reduce")
    assert_type(choice, PathChoice)
    if choice["path"] == "undecided":
        said.append(choice["reason"])
    footprint: EngineFootprint | None = backend.engine_footprint("cpu")
    if footprint is not None:
        assert_type(footprint["added_device_bytes"], int)
    rails = backend.rails("cpu")
    assert_type(rails, RailsInfo | None)
    if rails is not None:
        assert_type(rails["spare_interfaces"], list[str])
        said.append(rails["interface"] + rails["description"])
    assert_type(backend.topology.rail_peers, list[int])
    assert_type(backend.config.network.interface_name, str)
    assert_type(backend.timeout, timedelta)
    assert_type(backend.failure, str)
    info = fairring.build_info()
    assert_type(info, BuildInfo)
    assert_type(info["nccl"], str | None)
    assert_type(fairring.pending(), list[str])
    summary = fairring.summary(group)
    assert_type(summary.rows, list[fairring.PathUsage])
    said.append(summary.line())
    options = fairring.Options(engine=True, flat_threshold="1MiB")
    assert_type(options.engine, bool | None)
    return said
"""

# Misuses that mypy lets pass where a result is Any or pybind's plain `dict`: each must be the error that
# only the stub's TypedDict or Optional gives (under pybind's `object` they fail with other messages), so
# the stub, not mypy's leniency, is what the snippet above passes.
MISUSE_SNIPPET = """
from __future__ import annotations

import torch

import fairring

backend = fairring.backend_of()
stats = backend.engine_stats()
ops = stats["ops"]  # misuse: no None check, and engine_stats is None where the group has no engine
choice = backend.path_for(1, torch.float32)
reason = choice["why"]  # misuse: a key path_for never returns
path: int = choice["path"]  # misuse: a str
"""
# What mypy says of each misuse, in order.
MISUSE_ERRORS = [
    'Value of type "EngineStats | None" is not indexable',
    'TypedDict "PathChoice" has no key "why"',
    'Incompatible types in assignment (expression has type "Literal[',
]

# fairring's own modules are not yet clean under --strict: their errors are silenced (silent, so their
# types are still read); the stub and the TypedDicts, given on the command line, are checked.
MYPY_CONFIG = """
[mypy]
[mypy-fairring.*]
follow_imports = silent
"""


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for this module's runs: the second reuses what the first read of torch's stubs (seconds)."""
    return tmp_path_factory.mktemp("mypy-cache")


def mypy(tmp_path: Path, snippet: str, cache: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "snippet.py").write_text(snippet)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    # The checkout: an editable install's import hook is invisible to mypy.
    env = {**os.environ, "MYPYPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        f"--cache-dir={cache}",
        f"--config-file={tmp_path / 'mypy.ini'}",
        "--show-error-codes",
        "snippet.py",
        str(STUB),
        str(REPO / "fairring" / "types.py"),
    ]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert "No module named mypy" not in done.stderr, (
        "install the dev requirements: pip install -r requirements-dev.txt"
    )
    return done


@pytest.mark.timeout(300)
def test_a_users_code_that_calls_each_accessor_passes_mypy_strict(tmp_path: Path, mypy_cache: Path) -> None:
    done = mypy(tmp_path, USER_SNIPPET, mypy_cache)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(300)
def test_a_misused_result_fails_mypy_strict(tmp_path: Path, mypy_cache: Path) -> None:
    done = mypy(tmp_path, MISUSE_SNIPPET, mypy_cache)
    assert done.returncode == 1, done.stdout + done.stderr
    misuses = [number for number, line in enumerate(MISUSE_SNIPPET.splitlines(), 1) if "# misuse" in line]
    errors = [line for line in done.stdout.splitlines() if ": error: " in line]
    # Each misuse is one error, on its line, and nothing else is: the stub and the TypedDicts are clean.
    assert len(errors) == len(MISUSE_ERRORS), done.stdout
    for error, number, text in zip(errors, misuses, MISUSE_ERRORS, strict=True):
        assert error.startswith(f"snippet.py:{number}: error: {text}"), (error, number, text)


def test_the_wheel_ships_the_marker_and_the_stub() -> None:
    """setuptools >= 69 adds py.typed and .pyi files by itself; pyproject.toml allows setuptools 64, which does not."""
    [call] = [
        node
        for node in ast.walk(ast.parse((REPO / "setup.py").read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setup"
    ]
    [package_data] = [keyword.value for keyword in call.keywords if keyword.arg == "package_data"]
    assert set(ast.literal_eval(package_data)["fairring"]) >= {"py.typed", "_C.pyi"}
    assert (REPO / "fairring" / "py.typed").read_text() == ""  # PEP 561: "partial\n" would mean a partial stub
    assert STUB.is_file()


# Stub and module: names, and pybind's argument names and defaults.


def declared(body: list[ast.stmt]) -> set[str]:
    """The names a stub's module or class body declares: functions, classes and annotated names."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def stub_names(tree: ast.Module) -> tuple[set[str], dict[str, set[str]]]:
    """The stub's top-level names, and each class's own members."""
    members = {node.name: declared(node.body) for node in tree.body if isinstance(node, ast.ClassDef)}
    return declared(tree.body), members


def public(names: Iterable[str]) -> set[str]:
    return {name for name in names if not name.startswith("_")}


# Bound only where torch's c10d Backend lacks it (torch 2.11); inherited from c10d's elsewhere.
CONDITIONAL_MEMBERS = {"Backend": {"options"}}


def test_the_stub_names_every_public_name_of_the_module_and_no_other() -> None:
    names, members = stub_names(ast.parse(STUB.read_text()))
    assert "_testing" in names
    built = public(dir(_C))
    # ReconfigurableBackend is built only against a torch with c10d's reconfigure.
    assert public(names) - {"ReconfigurableBackend"} == built - {"ReconfigurableBackend"}
    for name in built:
        kind = getattr(_C, name)
        if isinstance(kind, type):
            own = public(vars(kind)) - CONDITIONAL_MEMBERS.get(name, set())
            assert public(members[name]) == own, name


def pybind_parameters(doc: str) -> list[tuple[str, str | None]]:
    """The (name, default's repr or None) of each parameter of pybind's signature line, self left out."""
    inside = doc.split("\n", 1)[0].split("(", 1)[1].rsplit(") ->", 1)[0]
    parameters: list[str] = []
    depth = start = 0
    for index, char in enumerate(inside + ","):
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        elif char == "," and depth == 0:
            parameters.append(inside[start:index].strip())
            start = index + 1
    found: list[tuple[str, str | None]] = []
    for parameter in filter(None, parameters):
        name, _, rest = parameter.partition(":")
        default = rest.split(" = ", 1)[1] if " = " in rest else None
        found.append((name.strip(), default))
    return [item for item in found if item[0] != "self"]


def stub_parameters(function: ast.FunctionDef) -> list[tuple[str, str | None]]:
    """The (name, default) of each parameter; a default of `...` as "...", a literal as pybind writes it."""
    arguments = [arg.arg for arg in function.args.args if arg.arg != "self"]
    defaults: list[str | None] = [None] * (len(arguments) - len(function.args.defaults))
    for default in function.args.defaults:
        literal = ast.literal_eval(default)
        defaults.append("..." if literal is Ellipsis else repr(literal))
    return list(zip(arguments, defaults, strict=True))


def test_the_stubs_parameters_are_pybinds() -> None:
    tree = ast.parse(STUB.read_text())
    checked = 0
    scopes: list[tuple[object, list[ast.stmt]]] = [(_C, tree.body)]
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_")]
    scopes += [(getattr(_C, node.name), node.body) for node in classes]
    for owner, body in scopes:
        for node in body:
            if not isinstance(node, ast.FunctionDef):
                continue
            real = getattr(owner, node.name, None)
            doc = getattr(real, "__doc__", None) or ""
            # Properties have no call signature, and an overloaded function's is (*args, **kwargs).
            if isinstance(real, property) or "Overloaded function." in doc:
                continue
            assert re.match(rf"{re.escape(node.name)}\(", doc), (node.name, doc)
            expected = pybind_parameters(doc)
            given = stub_parameters(node)
            assert [name for name, _ in given] == [name for name, _ in expected], node.name
            for (name, stub_default), (_, bound_default) in zip(given, expected, strict=True):
                assert (stub_default is None) == (bound_default is None), (node.name, name)
                if stub_default not in (None, "..."):
                    assert stub_default == bound_default, (node.name, name)
            checked += 1
    assert checked >= 20, checked  # the signatures were read, not skipped


# TypedDicts and real results.


def mismatches(value: object, hint: Any, where: str) -> list[str]:
    """Where `value` is not of type `hint`: TypedDicts by their exact keys, then every value, recursively."""
    origin, args = get_origin(hint), get_args(hint)
    if is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not a dict"]
        hints = get_type_hints(hint)
        found = [] if set(value) == set(hints) else [f"{where}: keys {sorted(value)}, declared {sorted(hints)}"]
        for key in sorted(hints.keys() & value.keys()):
            found += mismatches(value[key], hints[key], f"{where}[{key!r}]")
        return found
    if origin is Literal:
        return [] if value in args else [f"{where}: {value!r} is none of {args}"]
    if origin in (Union, types.UnionType):
        return [] if any(not mismatches(value, arg, where) for arg in args) else [f"{where}: {value!r} not {hint}"]
    if origin in (list, dict, tuple):
        if not isinstance(value, origin):
            return [f"{where}: {value!r} is not a {origin.__name__}"]
        if origin is list:
            return [
                error for index, item in enumerate(value) for error in mismatches(item, args[0], f"{where}[{index}]")
            ]
        if origin is tuple:
            if len(value) != len(args):
                return [f"{where}: {value!r} is not of {len(args)} items"]
            return [error for index, item in enumerate(value) for error in mismatches(item, args[index], where)]
        return [
            error
            for key, item in value.items()
            for error in mismatches(key, args[0], where) + mismatches(item, args[1], f"{where}[{key!r}]")
        ]
    if hint is type(None):
        return [] if value is None else [f"{where}: {value!r} is not None"]
    # bool is an int in Python, never in these dicts; an int is a float for type checkers.
    accepted = {int: (int,), float: (float, int), bool: (bool,), str: (str,)}[hint]
    if isinstance(value, accepted) and not (hint is not bool and isinstance(value, bool)):
        return []
    return [f"{where}: {value!r} is not a {hint.__name__}"]


def test_the_checker_finds_a_drifted_dict() -> None:
    """Negative control of mismatches(): a key missing, a key more, a value of another type."""
    stats: dict[str, object] = {
        "capacity_bytes": 1,
        "bytes_in_use": 2,
        "peak_bytes_in_use": 3,
        "leases_in_use": 4,
        "peak_leases_in_use": 5,
        "leases_granted": 6,
    }
    assert mismatches(stats, StagingStats, "s") == []
    assert mismatches({**stats, "new": 1}, StagingStats, "s") != []
    assert mismatches({**stats, "leases_granted": 6.0}, StagingStats, "s") != []
    assert mismatches({**stats, "leases_granted": True}, StagingStats, "s") != []
    del stats["capacity_bytes"]
    assert mismatches(stats, StagingStats, "s") != []


def test_the_functions_without_a_group_return_their_typed_dicts() -> None:
    assert mismatches(_C.build_info(), ExtensionBuildInfo, "_C.build_info()") == []
    assert mismatches(fairring.build_info(), BuildInfo, "fairring.build_info()") == []
    addresses = _C.interface_addresses()
    assert addresses, "every host has lo"
    assert mismatches(addresses, list[InterfaceAddress], "interface_addresses()") == []
    shape = _C.plan_shape(1 << 20, 4, 2, 2, 32, 4 << 20, 32, 50 << 20, 4)
    assert mismatches(shape, PlanShape, "plan_shape()") == []


def each_accessor() -> dict[str, object]:
    """On a rank of an auto group, after one all-reduce has made the engine and measured: every accessor's answer."""
    dist.all_reduce(torch.ones(1 << 16))
    backend = fairring.backend_of()
    return {
        "engine_stats": backend.engine_stats("cpu"),
        "staging_stats": backend.staging_stats("cpu"),
        "measured_threshold": backend.measured_threshold("cpu", "all_reduce"),
        "usage": backend.usage(),
        "path_for": backend.path_for(1 << 20, torch.float32, "cpu", "all_reduce"),
        "engine_footprint": backend.engine_footprint("cpu"),
        "rails": backend.rails("cpu"),
        "failure": backend.failure,
        "timeout": backend.timeout,
    }


EXPECTED_TYPES: dict[str, Any] = {
    "engine_stats": EngineStats,
    "staging_stats": StagingStats,
    "measured_threshold": MeasuredThreshold,
    "usage": list[UsageRow],
    "path_for": PathChoice,
    "engine_footprint": EngineFootprint,
    "rails": RailsInfo,
    "failure": str,
}


@pytest.mark.timeout(120)
def test_each_accessor_returns_its_typed_dict(tmp_path: Path) -> None:
    auto = {"FAIRRING_FLAT_THRESHOLD": "auto", "FAIRRING_AUTO_BUDGET": "3", "FAIRRING_AUTO_CACHE": str(tmp_path)}
    with RankPool(Layout(2, 1), InitSpec(extra_env=auto)) as pool:
        results = pool.run(each_accessor)
    for rank, answers in enumerate(results):
        for name, expected in EXPECTED_TYPES.items():
            # Every accessor answers here: no None hides a dict's keys.
            assert answers[name] is not None, (rank, name)
            assert mismatches(answers[name], expected, name) == [], (rank, answers[name])
        assert answers["usage"], rank
        assert isinstance(answers["timeout"], timedelta), rank
