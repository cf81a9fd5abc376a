"""The log lines the docs show, and the check that a line a test made reads as they show it.

A line in the docs is what an operator greps for; one that no run writes misleads. Each documented
line is claimed by a test that makes it (in a real run, or from the code that writes it fed a
described machine, where the docs say so) and passes it to `assert_reads_as_documented`;
tests/test_docs.py fails on a documented line that no test claims.

A documented line matches a made one when the made one holds the documented line's fixed text, in
order. Fixed is what is not a value: words with a digit (ranks, sizes, addresses, eth1), quoted
settings, and an ellipsis (the docs cut a long line) are values, and a value matches anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LEVELS = "DEBUG|INFO|WARNING|ERROR"
# What fairring's handler puts before each line (fairring/_log.py): time, host:pid, rank, level.
PREFIX = re.compile(rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{{3}} \S+:\d+ \[rank \d+\] fairring (?P<level>{LEVELS}): ")
_VALUE = re.compile(r"'[^']*'|\S*\d\S*|\.\.\.|…")
# A test claims a line by calling the check with the doc's path and a text from the line, both literal.
CLAIM = re.compile(r"assert_reads_as_documented\(\s*[^,]+,\s*\"(?P<doc>[^\"]+)\",\s*\"(?P<anchor>[^\"]+)\"")


@dataclass(frozen=True)
class DocumentedLine:
    doc: str  # its file, relative to the repository
    number: int  # the line it starts on
    level: str
    message: str  # after the level; a block's continuation lines joined by a space

    def fixed_parts(self) -> list[str]:
        """The text between its values, in order."""
        return [part.strip() for part in _VALUE.split(self.message) if part.strip()]


def documented_log_lines(docs: list[Path] = DOCS) -> list[DocumentedLine]:
    """Every fairring log line the docs show (with its prefix, in a code block)."""
    found = []
    for path in docs:
        lines = path.read_text().splitlines()
        for index, line in enumerate(lines):
            start = PREFIX.search(line)
            if not start:
                continue
            parts = [line[start.end() :].strip()]
            indent = len(line) - len(line.lstrip())
            following = index + 1
            # An indented block's next lines, as deep, continue it (the docs wrap long lines so).
            while following < len(lines) and indent and lines[following].startswith(" " * indent):
                if PREFIX.search(lines[following]) or not lines[following].strip():
                    break
                parts.append(lines[following].strip())
                following += 1
            relative = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
            found.append(DocumentedLine(relative, index + 1, start.group("level"), " ".join(parts)))
    return found


def documented(doc: str, anchor: str, docs: list[Path] = DOCS) -> DocumentedLine:
    """The one documented line of `doc` whose text holds `anchor`."""
    matches = [line for line in documented_log_lines(docs) if line.doc == doc and anchor in line.message]
    assert len(matches) == 1, f"{doc} shows {len(matches)} log lines holding {anchor!r}, not one"
    return matches[0]


def misreadings(made: str, line: DocumentedLine) -> list[str]:
    """What of `line` the made line lacks: its level, or fixed parts (in order); empty if it reads alike."""
    problems = []
    prefix = PREFIX.search(made)
    if prefix:
        if prefix.group("level") != line.level:
            problems.append(f"level {prefix.group('level')}, documented {line.level}")
        made = made[prefix.end() :]
    position = 0
    for part in line.fixed_parts():
        found = made.find(part, position)
        if found < 0:
            problems.append(f"{part!r} is not in what was made after {made[:position][-40:]!r}")
            break
        position = found + len(part)
    return problems


def assert_reads_as_documented(made: str, doc: str, anchor: str) -> None:
    """`made` (a logged line, with or without fairring's prefix) reads as the line of `doc` holding `anchor`."""
    line = documented(doc, anchor)
    problems = misreadings(made, line)
    assert not problems, f"{doc}:{line.number} shows a line that was not made so: {problems}\nmade: {made}"


def claims(tests: Path = ROOT / "tests") -> set[tuple[str, str]]:
    """(doc, anchor) of every check a test file makes against the docs."""
    found = set()
    for path in sorted(tests.glob("*.py")):
        for match in CLAIM.finditer(path.read_text()):
            found.add((match.group("doc"), match.group("anchor")))
    return found


def unclaimed(lines: list[DocumentedLine], claimed: set[tuple[str, str]]) -> list[DocumentedLine]:
    """The documented lines no test checks."""
    return [line for line in lines if not any(doc == line.doc and anchor in line.message for doc, anchor in claimed)]
