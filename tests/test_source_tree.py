"""docs/design.md's "Source tree" against the files: every listed file exists, every source is listed.

The section is the intended tree; its "Moves still to make" names the steps between that tree and
the code today, and each of those must still be pending (its source here, its target not yet). Its
"Tests of each file" names, for every listed file, the tests that cover it: each of those must exist,
and each of its lines must be a file of the tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"
# The roots listed file by file, and which of their files count as sources.
CHECKED_ROOTS = {"csrc": (".h", ".cpp", ".cu", ".cuh"), "fairring": (".py",)}
TESTS = REPO / "tests"
TEST_MAP_HEADING = "### Tests of each file"


@dataclass(frozen=True)
class Move:
    source: str  # a path or a `name.*` pattern, relative to the repository
    target: str
    split: bool  # target ⇐ source: split out of it (the source stays)


def section(text: str, heading: str) -> str:
    match = re.search(rf"^{re.escape(heading)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"docs/design.md has no {heading!r} section"
    return match.group(1)


def listed_paths(tree_section: str) -> list[str]:
    """The fenced tree's entries as repository paths (folders end in /)."""
    block = re.search(r"^```\n(.*?)^```", tree_section, re.S | re.M)
    assert block, "the Source tree section has no fenced tree"
    paths: list[str] = []
    folders: list[str] = []  # the folder at each depth
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0, f"odd indentation in the tree: {line!r}"
        depth = indent // 2
        name = line.split()[0]
        assert depth <= len(folders), f"entry deeper than its folder: {line!r}"
        del folders[depth:]
        path = "".join(folders) + name
        paths.append(path)
        if name.endswith("/"):
            folders.append(name)
    return paths


def listed_files(tree_section: str) -> list[str]:
    """The tree's entries under the roots listed file by file: files and `name.*` patterns."""
    return [
        path for path in listed_paths(tree_section) if not path.endswith("/") and path.split("/")[0] in CHECKED_ROOTS
    ]


def map_of_tests(tree_section: str) -> dict[str, list[str]]:
    """The "Tests of each file" block: each line's entry (a path as the tree lists it), and its test files."""
    match = re.search(rf"^{re.escape(TEST_MAP_HEADING)}\n(.*?)(?=^#|\Z)", tree_section, re.S | re.M)
    assert match, f"the Source tree section has no {TEST_MAP_HEADING!r} subsection"
    block = re.search(r"^```\n(.*?)^```", match.group(1), re.S | re.M)
    assert block, f"{TEST_MAP_HEADING!r} has no fenced block"
    tests: dict[str, list[str]] = {}
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        entry, *named = line.split()
        assert entry not in tests, f"{entry} has two lines in {TEST_MAP_HEADING!r}"
        tests[entry] = named
    return tests


def untested_files(tree: str) -> list[str]:
    """Listed files that the map gives no test."""
    tests = map_of_tests(tree)
    return [path for path in listed_files(tree) if not tests.get(path)]


def missing_tests(tree: str) -> list[str]:
    """Names in the map that are not test files in tests/."""
    return sorted(
        {
            name
            for named in map_of_tests(tree).values()
            for name in named
            if not re.fullmatch(r"test_\w+\.py", name) or not (TESTS / name).is_file()
        }
    )


def unknown_map_entries(tree: str) -> list[str]:
    """Lines of the map for a file the tree does not list."""
    listed = set(listed_files(tree))
    return [entry for entry in map_of_tests(tree) if entry not in listed]


def pending_moves(tree_section: str) -> list[Move]:
    moves = []
    for source, arrow, target in re.findall(r"^- `([^`]+)` (→|⇐) `([^`]+)`", tree_section, re.M):
        if arrow == "→":
            moves.append(Move(source, target, split=False))
        else:  # target ⇐ source
            moves.append(Move(target, source, split=True))
    return moves


def expand(pattern: str) -> list[Path]:
    """The files a path or `name.*` pattern names."""
    path = REPO / pattern
    if pattern.endswith(".*"):
        return sorted(path.parent.glob(path.name))
    return [path] if path.is_file() else []


def sources() -> set[str]:
    found = set()
    for root, suffixes in CHECKED_ROOTS.items():
        for path in (REPO / root).rglob("*"):
            if path.is_file() and path.suffix in suffixes:
                found.add(path.relative_to(REPO).as_posix())
    return found


def missing_files(tree: str) -> list[str]:
    """Listed files that are neither in the tree nor the target of a pending move."""
    targets = {move.target for move in pending_moves(tree)}
    return [path for path in listed_files(tree) if not expand(path) and path not in targets]


def unlisted_sources(tree: str) -> list[str]:
    """Sources neither listed nor the source of a pending move."""
    listed: set[str] = set()
    for path in listed_paths(tree):
        listed.update(p.relative_to(REPO).as_posix() for p in expand(path))
    moving: set[str] = set()
    for move in pending_moves(tree):
        if not move.split:
            moving.update(p.relative_to(REPO).as_posix() for p in expand(move.source))
    return sorted(sources() - listed - moving)


def stale_moves(tree: str) -> list[str]:
    """Pending moves already made (their source gone or their target there)."""
    stale = []
    for move in pending_moves(tree):
        if not expand(move.source):
            stale.append(f"{move.source} is gone")
        if expand(move.target):
            stale.append(f"{move.target} exists")
    return stale


@pytest.fixture(scope="module")
def tree() -> str:
    return section(DESIGN.read_text(), "## Source tree")


def test_the_tree_parses(tree: str) -> None:
    paths = listed_paths(tree)
    assert {"csrc/", "fairring/"} <= set(paths)
    assert len(paths) == len(set(paths)), "an entry is listed twice"
    assert len(pending_moves(tree)) == len(re.findall(r"^- `", tree, re.M)), "a move does not parse"


def test_every_listed_file_exists(tree: str) -> None:
    assert not missing_files(tree), "listed in docs/design.md's Source tree, not in the tree"


def test_every_source_is_listed(tree: str) -> None:
    assert not unlisted_sources(tree), "sources missing from docs/design.md's Source tree"


def test_no_done_move_is_left_pending(tree: str) -> None:
    assert not stale_moves(tree), "drop the done moves from docs/design.md's list"


def test_every_listed_file_names_its_tests(tree: str) -> None:
    assert not untested_files(tree), f"listed files without tests in docs/design.md's {TEST_MAP_HEADING!r}"


def test_every_named_test_exists(tree: str) -> None:
    assert not missing_tests(tree), f"named in docs/design.md's {TEST_MAP_HEADING!r}, not in tests/"


def test_every_map_entry_is_in_the_tree(tree: str) -> None:
    assert not unknown_map_entries(tree), f"in docs/design.md's {TEST_MAP_HEADING!r}, not in the tree"


def test_the_checks_fail_on_a_drifted_tree(tree: str) -> None:
    """Negative control: a renamed entry shows as both a missing file and an unlisted source,
    and a move already made (here, one whose source does not exist) as stale."""
    drifted = tree.replace("    plan.*  ", "    plan_gone.*  ", 1)
    assert drifted != tree
    assert "csrc/engine/plan_gone.*" in missing_files(drifted)
    assert {"csrc/engine/plan.h", "csrc/engine/plan.cpp"} <= set(unlisted_sources(drifted))
    drifted = tree + "\n- `csrc/engine/never.*` → `csrc/engine/plan.*`\n"
    assert len(stale_moves(drifted)) == len(stale_moves(tree)) + 2


def test_the_map_checks_fail_on_a_drifted_map(tree: str) -> None:
    """Negative control: a listed file whose line names no test, or that has no line, shows as untested; a
    test renamed to one that does not exist as missing; a line for a file the tree lacks as unknown."""
    assert map_of_tests(tree)["csrc/engine/plan.*"], "the control needs plan.* to name its tests"
    line = re.search(r"^csrc/engine/plan\.\* .*$", tree, re.M)
    assert line
    drifted = tree.replace(line.group(0), "csrc/engine/plan.*", 1)
    assert set(untested_files(drifted)) == {*untested_files(tree), "csrc/engine/plan.*"}
    drifted = tree.replace(line.group(0) + "\n", "", 1)
    assert drifted != tree and "csrc/engine/plan.*" in untested_files(drifted)
    drifted = tree.replace(line.group(0), line.group(0) + " test_plans_gone.py", 1)
    assert set(missing_tests(drifted)) == {*missing_tests(tree), "test_plans_gone.py"}
    drifted = tree.replace(line.group(0), line.group(0) + " harness.py", 1)
    assert "harness.py" in missing_tests(drifted)  # a helper of the tests is not a test
    drifted = tree.replace(line.group(0), line.group(0) + "\ncsrc/engine/gone.*  test_plans.py", 1)
    assert set(unknown_map_entries(drifted)) == {*unknown_map_entries(tree), "csrc/engine/gone.*"}
    # A map entry spelled as a path relative to its folder (as the tree indents it) is not the tree's.
    drifted = tree.replace(line.group(0), line.group(0).replace("csrc/engine/plan.*", "plan.*"), 1)
    assert "plan.*" in unknown_map_entries(drifted) and "csrc/engine/plan.*" in untested_files(drifted)


# One job per file keeps files short: a C++ file over this many lines is doing several.
MAX_CSRC_LINES = 700


def oversized(paths: list[Path], limit: int = MAX_CSRC_LINES) -> list[str]:
    """`path: lines` for each file longer than `limit` lines."""
    counts = {path: len(path.read_text().splitlines()) for path in paths}
    return [f"{path.relative_to(REPO).as_posix()}: {lines}" for path, lines in counts.items() if lines > limit]


def test_no_csrc_file_is_over_the_limit() -> None:
    files = sorted(p for p in (REPO / "csrc").rglob("*") if p.suffix in CHECKED_ROOTS["csrc"])
    assert files, "no C++ sources found"
    assert not oversized(files), f"split these by job (docs/design.md, Source tree): {oversized(files)}"


def test_the_size_check_flags_a_long_file() -> None:
    long_file = REPO / "csrc" / "engine" / "slices.cpp"
    lines = len(long_file.read_text().splitlines())
    assert oversized([long_file], limit=lines - 1) == [f"csrc/engine/slices.cpp: {lines}"]
    assert oversized([long_file], limit=lines) == []


# torch's checks; a message-less one tells the user only "Expected ... to be true" or, for an
# internal assert, to report a PyTorch bug. The _WITH form takes the error class first.
CHECK_MACRO = re.compile(r"\b(TORCH_CHECK(?:_VALUE|_TYPE|_INDEX|_WITH)?|TORCH_INTERNAL_ASSERT)\s*\(")


def macro_arguments(text: str, open_paren: int) -> list[str]:
    """The top-level arguments of the call whose "(" is at `open_paren` (strings and nesting skipped)."""
    arguments: list[str] = []
    current: list[str] = []
    depth = 0
    quote = ""
    index = open_paren
    while index < len(text):
        char = text[index]
        if quote:
            current.append(char)
            if char == "\\":
                current.append(text[index + 1])
                index += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
            current.append(char)
        elif char == "(":
            depth += 1
            if depth > 1:
                current.append(char)
        elif char == ")":
            depth -= 1
            if depth == 0:
                arguments.append("".join(current))
                return arguments
            current.append(char)
        elif char == "," and depth == 1:
            arguments.append("".join(current))
            current = []
        else:
            current.append(char)
        index += 1
    raise AssertionError(f"unbalanced call at offset {open_paren}")


def checks_without_message(path: Path, text: str) -> list[str]:
    """`path:line: MACRO` for each check in `text` that has a condition but no message."""
    found = []
    for match in CHECK_MACRO.finditer(text):
        if text[: match.start()].rstrip().endswith("#define"):
            continue
        arguments = macro_arguments(text, match.end() - 1)
        needed = 3 if match.group(1) == "TORCH_CHECK_WITH" else 2
        if len(arguments) < needed:
            found.append(f"{path.relative_to(REPO).as_posix()}:{text.count(chr(10), 0, match.start()) + 1}: {match[1]}")
    return found


def test_every_cpp_check_says_what_to_change() -> None:
    files = sorted(p for p in (REPO / "csrc").rglob("*") if p.suffix in CHECKED_ROOTS["csrc"])
    bare = [entry for path in files for entry in checks_without_message(path, path.read_text())]
    assert not bare, f"give each a message that says what failed and what to change: {bare}"


def test_the_check_rule_flags_a_bare_check() -> None:
    path = REPO / "csrc" / "engine" / "plan.cpp"
    bare = "int f(int n) {\n  TORCH_CHECK(n > 0);\n  TORCH_CHECK_WITH(DistBackendError, f(n, 1) > 0);\n"
    said = '  TORCH_CHECK(g(n, ")"), "n is ", n);\n  TORCH_INTERNAL_ASSERT(n, "x");\n}\n'
    assert checks_without_message(path, bare + said) == [
        "csrc/engine/plan.cpp:2: TORCH_CHECK",
        "csrc/engine/plan.cpp:3: TORCH_CHECK_WITH",
    ]
