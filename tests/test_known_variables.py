"""Settings that catch typos (fairring/_known_variables.py) and the test switches' one reader
(csrc/test_switches.cpp): an unknown FAIRRING_* variable is named once, with the closest known one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fairring import _C
from fairring._known_variables import BUILD_AND_TOOLS, KNOWN, SETTINGS, unknown_variable_notes

REPO = Path(__file__).resolve().parents[1]


def test_a_misspelled_variable_names_the_closest_known_one() -> None:
    notes = unknown_variable_notes(["FAIRRING_SLIC_SIZE", "FAIRRING_TOTAL_MEMROY", "FAIRRING_ZZZ"])
    assert notes == [
        "FAIRRING_SLIC_SIZE is set, but fairring has no such variable and ignores it; did you mean "
        "FAIRRING_SLICE_SIZE?",
        "FAIRRING_TOTAL_MEMROY is set, but fairring has no such variable and ignores it; did you mean "
        "FAIRRING_TOTAL_MEMORY?",
        "FAIRRING_ZZZ is set, but fairring has no such variable and ignores it; docs/configuration.md lists "
        "every variable",
    ]


def test_known_variables_other_prefixes_and_test_switches_pass() -> None:
    assert unknown_variable_notes([*KNOWN, "NCCL_DEBUG", "FAIRRING", "FAIRRING_TEST_NIXL_FULL"]) == []


def test_the_known_settings_are_those_the_configuration_page_documents() -> None:
    page = (REPO / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"\bFAIRRING_[A-Z0-9_]*[A-Z0-9]\b", page))
    # The page's example of a typo, and the test suite's private prefix.
    documented = {name for name in documented if name != "FAIRRING_SLIC_SIZE" and not name.startswith("FAIRRING_TEST_")}
    assert SETTINGS <= documented, f"document these in docs/configuration.md: {sorted(SETTINGS - documented)}"
    assert documented <= KNOWN, f"add these to fairring/_known_variables.py: {sorted(documented - KNOWN)}"
    assert not SETTINGS & BUILD_AND_TOOLS


@pytest.mark.timeout(120)
def test_one_warning_per_unknown_variable_per_process() -> None:
    # Two groups made, as a job makes its default group and then subgroups.
    script = (
        "import torch.distributed as dist, fairring\n"
        "dist.init_process_group('fairring', store=dist.HashStore(), rank=0, world_size=1)\n"
        "dist.new_group([0])\n"
        "dist.destroy_process_group()\n"
    )
    env = {**os.environ, "FAIRRING_SLIC_SIZE": "4M", "FAIRRING_SLICE_SIZE": "4M"}
    env.pop("FAIRRING_LOG_LEVEL", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=100, check=True
    )
    lines = [line for line in done.stderr.splitlines() if "FAIRRING_SLIC_SIZE" in line]
    assert len(lines) == 1, done.stderr
    assert "did you mean FAIRRING_SLICE_SIZE?" in lines[0], done.stderr


def test_a_test_switch_is_read_through_its_one_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRRING_TEST_CORRUPT_ENGINE_RESULT", "1")
    assert _C.test_switch("CORRUPT_ENGINE_RESULT") == "1"
    monkeypatch.setenv("FAIRRING_TEST_CORRUPT_ENGINE_RESULT", "")
    assert _C.test_switch("CORRUPT_ENGINE_RESULT") is None
    with pytest.raises(RuntimeError, match="FAIRRING_TEST_NOT_A_SWITCH is not a test switch"):
        _C.test_switch("NOT_A_SWITCH")


# A second reader: the C++ reads the environment only in test_switches.cpp, and no Python module reads a
# test switch from it (they ask _C.test_switch).
ENV_READ = {
    ".cpp": re.compile(r"\bgetenv\s*\("),
    ".py": re.compile(r"environ[^\n]*FAIRRING_TEST_|CORRUPT_ENGINE_RESULT, "),
}


def env_readers(sources: dict[Path, str]) -> list[str]:
    """The files, other than the switches' own reader, that read the environment as ENV_READ defines it."""
    found = []
    for path, text in sources.items():
        pattern = ENV_READ.get(path.suffix)
        if pattern and path.name != "test_switches.cpp" and pattern.search(text):
            found.append(path.relative_to(REPO).as_posix())
    return found


def test_test_switches_are_read_in_one_place() -> None:
    product = [p for p in (REPO / "csrc").rglob("*.cpp") if "testing" not in p.parts]
    product += list((REPO / "fairring").rglob("*.py"))
    assert env_readers({path: path.read_text() for path in product}) == []


def test_the_one_reader_rule_flags_a_second_reader() -> None:
    cpp = REPO / "csrc" / "engine" / "plan.cpp"
    py = REPO / "fairring" / "_dispatch.py"
    # As csrc/device/emulated.cpp and fairring/_dispatch.py read theirs before.
    sources = {
        cpp: cpp.read_text() + 'const char* v = std::getenv("FAIRRING_TEST_EMULATED_DEVICE");\n',
        py: py.read_text() + 'corrupt = os.environ.get(CORRUPT_ENGINE_RESULT, "").strip()\n',
    }
    assert env_readers(sources) == ["csrc/engine/plan.cpp", "fairring/_dispatch.py"]
