"""The docs against the project: install commands, quoted figures, defaults, and what has run on a GPU.

Pure text checks (no ranks, no network), each with a negative control showing that
its checker flags what it is meant to flag.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from documented_logs import claims, documented_log_lines, misreadings, unclaimed

from fairring import _config as config
from fairring._sizes import parse_size

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = sorted(
    [
        *(ROOT / "fairring").rglob("*.py"),
        *(ROOT / "csrc").rglob("*.cpp"),
        *(ROOT / "csrc").rglob("*.h"),
        ROOT / "setup.py",
        ROOT / "pyproject.toml",
    ]
)


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- (a) no command installs another project --------------------------------------------

# `pip install`, `pip3 install`, `python -m pip install`, `uv pip install`; the words may be
# split across lines (wrapped Markdown).
_PIP_INSTALL = re.compile(r"\bpip3?\s+install\b")
# Where a command's arguments end: a code span's or shell's end, a comment, a parenthesis.
_COMMAND_END = re.compile(r"[`;|&)#]")
# Stripped from both ends of an argument: quotes, string and code-span delimiters, punctuation.
_STRIP = "'\"`()\\,;:."
# Words after which prose, not arguments, follows ("pip install . in this environment").
_PROSE = {
    "a", "and", "as", "first", "for", "from", "if", "in", "installs", "into", "on", "or", "so",
    "that", "the", "then", "to", "which", "with",
}  # fmt: skip
# PyPI's `fairring` is an unrelated project: the name alone, with extras, or with a version.
_OTHER_PROJECT = re.compile(r"fairring(?:\[[^\]]*\])?(?:\s*[=<>!~@;].*)?", re.IGNORECASE)


def install_arguments(text: str, start: int) -> list[str]:
    """The arguments of the `pip install` whose words end at `start`, as written.

    An argument list ends at a code span's end, a shell separator, a comment or a
    parenthesis; a line break ends it once a non-option argument has been seen (before
    that, a command wrapped after `install` goes on, as do adjacent string literals).
    """
    arguments: list[str] = []
    rest = text[start : start + 400]
    for line in rest.split("\n"):
        end = _COMMAND_END.search(line)
        words = line[: end.start()] if end else line
        for word in words.split():
            stripped = word.strip(_STRIP)
            if not stripped:
                continue
            if stripped.lower() in _PROSE:
                return arguments
            arguments.append(stripped)
        if end or any(not a.startswith("-") for a in arguments):
            break
    return arguments


def installs_another_project(text: str) -> list[str]:
    """Each `pip install ...` in `text` that would install PyPI's unrelated `fairring`, as written."""
    found = []
    for match in _PIP_INSTALL.finditer(text):
        arguments = install_arguments(text, match.end())
        if any(_OTHER_PROJECT.fullmatch(a) for a in arguments if not a.startswith("-")):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"line {line}: pip install {' '.join(arguments)}")
    return found


@pytest.mark.parametrize("path", DOCS + SOURCES, ids=relative)
def test_no_install_command_installs_another_project(path: Path) -> None:
    found = installs_another_project(path.read_text(errors="replace"))
    assert not found, (
        f"{relative(path)} tells users to install PyPI's `fairring`, an unrelated project: {found}. "
        "fairring's distribution is torch-fairring; NIXL installs with pip install 'nixl-cu13>=1.4'"
    )


@pytest.mark.parametrize(
    "sample",
    [
        "NIXL is optional: `pip install 'fairring[nixl]'` installs it.",
        'install it with pip install "fairring[nixl]", or use FAIRRING_RAILS_TRANSPORT=tensorpipe',
        "pip install fairring",
        "python -m pip install --upgrade fairring==0.1",
        "(`pip install\nfairring[nixl]`)",
        '"; reinstall it with pip install "\n    "\'fairring[nixl]\'");',
    ],
)
def test_the_install_checker_flags_the_other_project(sample: str) -> None:
    assert installs_another_project(sample), sample


@pytest.mark.parametrize(
    "sample",
    [
        "pip install --no-build-isolation .          # or: pip wheel --no-build-isolation --no-deps -w dist .",
        "`pip install 'nixl-cu13>=1.4'`, or `pip install --no-build-isolation\n'.[nixl]'` from the checkout",
        "pip install dist/torch_fairring-*.whl",
        "pip install torch-fairring 'torch-fairring[nixl]'",
        "reinstall fairring with `pip install --no-build-isolation .` in this environment",
        "pip install --no-build-isolation . in an environment that has fairring's torch",
        "install it with pip install 'nixl-cu13>=1.4', or use FAIRRING_RAILS_TRANSPORT=tensorpipe",
    ],
)
def test_the_install_checker_passes_fairrings_own_commands(sample: str) -> None:
    assert not installs_another_project(sample), sample


# --- (b) the README's "How fast" figures are benchmarks.md's ---------------------------

# A figure: a number with a unit of time, a ratio or a percentage ("568 ms", "1.51x", "95%").
_FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?: ?(?:ms|us|s)\b|x\b|%)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def section(markdown: str, anchor: str) -> str:
    """The text of the section whose heading's anchor is `anchor`, up to the next heading of its level or above."""
    lines = markdown.splitlines()
    # Headings, by line: (level, anchor); lines inside fenced code blocks are not headings.
    headings: dict[int, tuple[int, str]] = {}
    fenced = False
    for index, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"(#+)\s+(.*)", line)
        if heading:
            headings[index] = (len(heading.group(1)), _slug(heading.group(2)))
    for index, (level, slug) in headings.items():
        if slug == anchor:
            end = next((i for i, (deeper, _) in headings.items() if i > index and deeper <= level), len(lines))
            return "\n".join(lines[index + 1 : end])
    raise AssertionError(f"no heading with anchor #{anchor}")


def how_fast_paragraph() -> str:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"\*\*How fast\.\*\*(.*?)(?:\n\n|\Z)", readme, re.DOTALL)
    assert match, "README.md has no **How fast.** paragraph"
    return match.group(1)


def figures(text: str) -> list[str]:
    return [" ".join(f.split()) for f in _FIGURE.findall(text)]


def missing_figures(paragraph: str, benchmarks: str) -> list[str]:
    """The figures of `paragraph` that the benchmarks text it links to does not state."""
    link = re.search(r"docs/benchmarks\.md#([\w\-]+)", paragraph)
    source = section(benchmarks, link.group(1)) if link else benchmarks
    stated = set(figures(source))
    return [f for f in figures(paragraph) if f not in stated]


def test_the_readmes_how_fast_figures_are_in_benchmarks_md() -> None:
    paragraph = how_fast_paragraph()
    quoted = figures(paragraph)
    assert len(quoted) >= 3, f"the How fast paragraph should quote measured figures: {quoted}"
    missing = missing_figures(paragraph, (ROOT / "docs" / "benchmarks.md").read_text())
    assert not missing, f"README.md's How fast figures not in the docs/benchmarks.md section it links: {missing}"


def readme_paragraphs_quoting_benchmarks() -> list[str]:
    """Every README paragraph that links a docs/benchmarks.md section and quotes a figure."""
    paragraphs = re.split(r"\n\s*\n", (ROOT / "README.md").read_text())
    return [p for p in paragraphs if re.search(r"docs/benchmarks\.md#", p) and figures(p)]


def test_every_readme_figure_is_in_the_section_it_links() -> None:
    """Not only How fast: a status line that quotes a figure (or contradicts a table) must quote that table."""
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text()
    for paragraph in readme_paragraphs_quoting_benchmarks():
        missing = missing_figures(paragraph, benchmarks)
        assert not missing, f"README.md quotes {missing}, which its linked section does not state: {paragraph[:120]}"


def test_the_figure_check_flags_a_made_up_figure() -> None:
    paragraph = how_fast_paragraph()
    invented = paragraph.replace("568 ms", "571 ms") if "568 ms" in paragraph else paragraph + " 9.87x"
    assert missing_figures(invented, (ROOT / "docs" / "benchmarks.md").read_text())


# --- (c) configuration.md's defaults are config.py's -----------------------------------

SIZE_DEFAULTS = {
    "FAIRRING_TOTAL_MEMORY": config.DEFAULT_TOTAL_MEMORY,
    "FAIRRING_SLICE_SIZE": config.DEFAULT_SLICE_SIZE,
    "FAIRRING_MIN_SHARD_SIZE": config.DEFAULT_MIN_SHARD_SIZE,
}
COUNT_DEFAULTS = {"FAIRRING_SLICES_IN_FLIGHT": config.DEFAULT_SLICES_IN_FLIGHT}


def table_defaults(markdown: str) -> dict[str, str]:
    """`| `VARIABLE` | `default` | ...` rows: the default as written, by variable."""
    rows = re.findall(r"^\| `(FAIRRING_[A-Z_]+)` \| `([^`|]+)` \|", markdown, re.MULTILINE)
    return dict(rows)


def wrong_defaults(markdown: str) -> list[str]:
    written = table_defaults(markdown)
    wrong = []
    for variable, default in SIZE_DEFAULTS.items():
        if variable not in written:
            wrong.append(f"{variable}: no row")
        elif parse_size(variable, written[variable], allow_zero=True) != default:
            wrong.append(f"{variable}: {written[variable]}, config.py {default}")
    for variable, default in COUNT_DEFAULTS.items():
        if variable not in written:
            wrong.append(f"{variable}: no row")
        elif int(written[variable]) != default:
            wrong.append(f"{variable}: {written[variable]}, config.py {default}")
    return wrong


@pytest.mark.parametrize("path", [ROOT / "docs" / "configuration.md", ROOT / "README.md"], ids=relative)
def test_documented_defaults_are_config_pys(path: Path) -> None:
    assert not wrong_defaults(path.read_text()), relative(path)


def test_the_defaults_check_flags_a_wrong_default() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    for row, wrong in [
        ("| `FAIRRING_SLICE_SIZE` | `4MiB` |", "| `FAIRRING_SLICE_SIZE` | `8MiB` |"),
        ("| `FAIRRING_SLICES_IN_FLIGHT` | `4` |", "| `FAIRRING_SLICES_IN_FLIGHT` | `8` |"),
    ]:
        assert row in text
        assert wrong_defaults(text.replace(row, wrong)), wrong


# --- (d) no doc says that nothing has run on a GPU -------------------------------------

# Claims that fairring as a whole has never run on a GPU. Sentences about one thing not yet
# run there ("that fix has not yet run on a GPU", "--cuda ... has not run on a GPU") are fine.
_NO_GPU_RUN = re.compile(
    r"\bno GPU runs?\b"
    r"|\bGPU run\W{0,3}\s*\(?none has (?:yet )?been (?:made|done)"
    r"|\bnever (?:been )?(?:run|ran|tested) on (?:a |any )?GPUs?\b"
    r"|\bnothing has (?:yet )?run on (?:a |any )?GPUs?\b"
    r"|\bno GPU has (?:yet )?(?:run|been used)\b"
    r"|\bhas not (?:yet )?run on any GPU\b"
    r"|\bwithout any GPU run\b",
    re.IGNORECASE,
)


def claims_no_gpu_run(text: str) -> list[str]:
    return [m.group(0) for m in _NO_GPU_RUN.finditer(" ".join(text.split()))]


@pytest.mark.parametrize("path", DOCS, ids=relative)
def test_no_doc_says_no_gpu_run_was_made(path: Path) -> None:
    found = claims_no_gpu_run(path.read_text())
    assert not found, f"{relative(path)} says no GPU run was made, against docs/benchmarks.md's On a GPU: {found}"


@pytest.mark.parametrize(
    "sample, flagged",
    [
        ("from hardware figures, not from a GPU run (none has been made).", True),
        ("fairring has never run on a GPU.", True),
        ("No GPU run has been made yet.", True),
        ("the CUDA engine was never\ntested on GPUs", True),
        ("fairring now premultiplies those itself; that fix has not yet run on a GPU.", False),
        ("`--cuda` runs the same study on GPUs; it has not run on a GPU.", False),
        ("Not yet run on a GPU.", False),
    ],
)
def test_the_gpu_run_check(sample: str, flagged: bool) -> None:
    assert bool(claims_no_gpu_run(sample)) == flagged, sample


# -- what to expect on your layout ------------------------------------------------------


def byte_ceiling(machines: int, ranks: int) -> str:
    """A flat ring's bytes through a machine's NICs over fairring's, rounded half up as the docs print it."""
    world = machines * ranks
    ratio = Fraction(world - 1, world) / Fraction(machines - 1, machines)
    exact = Decimal(ratio.numerator) / Decimal(ratio.denominator)
    return f"{exact.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP)}x"


def layout_table_errors(markdown: str) -> list[str]:
    """Cells of deploying.md's layout table that are not the byte formula's, and layouts it lacks."""
    text = section(markdown, "what-to-expect-on-your-layout")
    rows = [line.split("|")[1:-1] for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    errors = [] if [int(row[0]) for row in rows] == [2, 4, 8, 16, 32] else ["rows are not 2, 4, 8, 16, 32 machines"]
    for row in rows:
        machines = int(row[0])
        for ranks, cell in zip((1, 2, 4, 8), row[1:], strict=True):
            if cell.strip() != byte_ceiling(machines, ranks):
                errors.append(
                    f"{machines} x {ranks}: {cell.strip()}, the formula gives {byte_ceiling(machines, ranks)}"
                )
    return errors


def test_the_layout_table_is_the_byte_formula() -> None:
    assert layout_table_errors((ROOT / "docs" / "deploying.md").read_text()) == []


def test_the_layout_check_flags_a_wrong_cell() -> None:
    text = (ROOT / "docs" / "deploying.md").read_text()
    assert layout_table_errors(text.replace("| 4 | 1.00x | 1.17x |", "| 4 | 1.00x | 1.40x |")) == [
        "4 x 2: 1.40x, the formula gives 1.17x"
    ]


def test_the_readme_quotes_the_layout_tables_range() -> None:
    cells = [byte_ceiling(m, r) for m in (2, 4, 8, 16, 32) for r in (2, 4, 8)]
    low, high = min(cells, key=lambda c: float(c[:-1])), max(cells, key=lambda c: float(c[:-1]))
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"at {low} to {high} with 2 to 8 ranks on each of 2 to 32 machines" in readme


# -- a tool for real clusters is one that has run as documented ---------------------------------

# Modules that are internal to a study (run by it on emulated hosts, never documented to run
# across real machines): no doc may tell a reader to run them.
INTERNAL_MODULES = ("fairring.bench.worker", "fairring.bench.training_worker")


def internal_modules_recommended(text: str) -> list[str]:
    return [module for module in INTERNAL_MODULES if re.search(rf"-m {re.escape(module)}\b|`{module}`", text)]


@pytest.mark.parametrize("path", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=relative)
def test_no_doc_tells_a_reader_to_run_an_internal_module(path: Path) -> None:
    assert internal_modules_recommended(path.read_text()) == [], "recommend python -m fairring.validate instead"


def test_the_internal_module_check_flags_one() -> None:
    assert internal_modules_recommended("torchrun --nnodes 4 -m fairring.bench.worker --sizes 1MiB") == [
        "fairring.bench.worker"
    ]


# -- a figure in prose is its table's ---------------------------------------------------------
#
# Pinned narrowly, so that it flags contradictions and not prose: a sentence that names one
# size which keys a row of a table in its section (or in a section it links), and quotes a
# figure within a few words of it, quotes that row; a sentence that calls fairring faster or
# slower than Gloo or NCCL at sizes a table rates against that baseline says what the table's
# ratio says. Spreads ("234-264 ms") and figures of another run, said as such, are not a row's.

_SIZE = r"\d+(?:\.\d+)? ?[KMG]iB\b"
_PINNED_FIGURE = re.compile(r"(?<![\w.\-])(\d+(?:\.\d+)?)(?: ?(?:ms|us|s)\b|x\b)")
_RANGE_BEFORE = re.compile(r"(?:from|below|above|up to|over|under|to|-)\s*$")
_COMPARED = re.compile(r"\b(faster|slower) than (Gloo|NCCL)\b", re.IGNORECASE)
_AT_SIZES = re.compile(rf"\bat ((?:\d+(?:\.\d+)?(?:, | and | or ))*{_SIZE})")
_FROM_TO = re.compile(rf"\bfrom ({_SIZE}) to ({_SIZE})")
_NEAR = 40  # characters either side of a size in which a figure is that size's


def _normal(size: str) -> str:
    return " ".join(re.sub(r"(\d)([KMG]iB)", r"\1 \2", size).split())


def _bytes(size: str) -> int:
    return parse_size("size", size.replace(" ", ""))


def _blocks(markdown: str) -> list[list[str]]:
    """The lines between one heading and the next, outside fenced code."""
    blocks: list[list[str]] = [[]]
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced and re.match(r"#+\s", line):
            blocks.append([])
        elif not fenced:
            blocks[-1].append(line)
    return blocks


def _rows_by_size(lines: list[str]) -> dict[str, list[dict[str, str]]]:
    """Each table row keyed by the size in its first two cells, as {header: cell}."""
    rows: dict[str, list[dict[str, str]]] = {}
    header: list[str] = []
    for line in lines:
        if not line.startswith("|"):
            header = []
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not header:
            header = cells
        elif not re.fullmatch(r"[\s:\-|]+", line):
            row = dict(zip(header, cells, strict=False))
            for cell in cells[:2]:
                if re.fullmatch(_SIZE, cell):
                    rows.setdefault(_normal(cell), []).append(row)
    return rows


def _sentences(lines: list[str]) -> list[str]:
    prose = " ".join(line for line in lines if not line.startswith(("|", "    ")))
    return re.split(r"(?<=[.;:])\s+(?=[A-Z(])", " ".join(prose.split()))


def _states(rows: list[dict[str, str]], figure: str) -> bool:
    """Whether a row holds the figure, to the figure's own precision."""
    places = len(figure.partition(".")[2])
    wanted = Decimal(figure)
    for row in rows:
        for cell in row.values():
            for number in re.findall(r"\d+(?:\.\d+)?", cell):
                if Decimal(number).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP) == wanted:
                    return True
    return False


def _compared_sizes(after: str, rows: dict[str, list[dict[str, str]]]) -> list[str]:
    """The sizes a verdict names right after it ("at 16 and 64 MiB", "at every size from 1 KiB to 1 MiB")."""
    sizes = []
    listed = _AT_SIZES.match(after)
    if listed:
        unit = re.search(r"[KMG]iB", listed.group(1)).group()
        sizes += [f"{number} {unit}" for number in re.findall(r"\d+(?:\.\d+)?", listed.group(1))]
    spanned = _FROM_TO.search(after)
    if spanned and spanned.start() <= _NEAR:
        low, high = spanned.groups()
        sizes += [size for size in rows if _bytes(low) <= _bytes(size) <= _bytes(high)]
    return [size for size in sizes if size in rows]


def sentence_errors(sentence: str, rows: dict[str, list[dict[str, str]]]) -> list[str]:
    """What a sentence says of a size's table row that the row does not."""
    if re.search(r"another run|no record kept", sentence):
        return []
    errors = []
    sizes = {_normal(s) for s in re.findall(_SIZE, sentence)}
    pinned = [m for m in re.finditer(_SIZE, sentence) if not _RANGE_BEFORE.search(sentence[: m.start()])]
    if len(sizes) == 1 and pinned and _normal(pinned[0].group()) in rows:
        size = _normal(pinned[0].group())
        near = sentence[max(0, pinned[0].start() - _NEAR) : pinned[0].end() + _NEAR]
        errors += [f"{size}: {f} is not in its row" for f in _PINNED_FIGURE.findall(near) if not _states(rows[size], f)]
    for compared in _COMPARED.finditer(sentence):
        verdict, baseline = compared.groups()
        for size in _compared_sizes(sentence[compared.end() :].lstrip(), rows):
            for row in rows[size]:
                ratios = [cell for column, cell in row.items() if column.lower().endswith(f"vs {baseline.lower()}")]
                for ratio in ratios:
                    faster = float(ratio.rstrip("x")) > 1
                    if faster != (verdict.lower() == "faster"):
                        errors.append(f"{size}: {verdict} than {baseline}, its row says {ratio}")
    return errors


def prose_table_errors(markdown: str, linked: str = "") -> list[str]:
    """Every sentence of `markdown` against the tables of its block, or of the `linked` doc's section it links."""
    errors = []
    for block in _blocks(markdown):
        for sentence in _sentences(block):
            rows = _rows_by_size(block)
            links = r"\]\(#([\w\-]+)\)" if markdown == linked else r"\]\([\w/.]*benchmarks\.md#([\w\-]+)\)"
            for anchor in re.findall(links, sentence) if linked else []:
                for size, extra in _rows_by_size(section(linked, anchor).splitlines()).items():
                    rows.setdefault(size, []).extend(extra)
            errors += [f"{e} :: {sentence[:100]}" for e in sentence_errors(sentence, rows)]
    return errors


@pytest.mark.parametrize("path", DOCS, ids=relative)
def test_prose_figures_agree_with_their_tables(path: Path) -> None:
    assert prose_table_errors(path.read_text(), (ROOT / "docs" / "benchmarks.md").read_text()) == []


def test_the_prose_check_flags_a_wrong_figure_and_a_wrong_verdict() -> None:
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text()
    wrong_figure = (
        "At 64 MiB the engine took 125.0 ms against NCCL's 165.0 ms ([On a GPU](docs/benchmarks.md#on-a-gpu))."
    )
    # The contradiction issue 50 found in the README: the table has the engine faster at 64 MiB.
    wrong_verdict = "On one GPU it was slower than NCCL at 16 and 64 MiB ([On a GPU](docs/benchmarks.md#on-a-gpu))."
    right = (
        "On one GPU it was slower than NCCL at 16 MiB and took 121.1 ms at 64 MiB"
        " ([On a GPU](docs/benchmarks.md#on-a-gpu))."
    )
    assert [e.split(" :: ")[0] for e in prose_table_errors(wrong_figure, benchmarks)] == [
        "64 MiB: 125.0 is not in its row"
    ]
    verdicts = [e.split(" :: ")[0] for e in prose_table_errors(wrong_verdict, benchmarks)]
    assert "64 MiB: slower than NCCL, its row says 1.36x" in verdicts
    assert not [v for v in verdicts if v.startswith("16 MiB")], verdicts
    assert prose_table_errors(right, benchmarks) == []


# -- a torch version's status is stated once -------------------------------------------------
#
# deploying.md's Versions table says what ran on each torch; prose beside it that calls a
# version broken ("did not build") contradicts a row that says it passed, unless the sentence
# says that was before what the row ran ("the first run", "until").

_BROKEN = re.compile(r"\b(did not build|does not build|failed to build|fails to build|did not pass)\b")
_HISTORY = re.compile(r"\b(first|until|before|earlier)\b")


def version_status_errors(markdown: str) -> list[str]:
    text = section(markdown, "versions")
    passed = {
        version
        for line in text.splitlines()
        if line.startswith("|") and "passed" in line
        for version in re.findall(r"\b2\.\d+\.\d+\b", line.split("|")[1])
    }
    errors = []
    for sentence in _sentences(text.splitlines()):
        for version in sorted(passed):
            if version in sentence and _BROKEN.search(sentence) and not _HISTORY.search(sentence):
                errors.append(f"torch {version}: its row says passed, and: {sentence[:120]}")
    return errors


def test_each_torch_versions_status_is_stated_once() -> None:
    assert version_status_errors((ROOT / "docs" / "deploying.md").read_text()) == []


def test_the_version_check_flags_a_row_and_a_sentence_that_disagree() -> None:
    text = (ROOT / "docs" / "deploying.md").read_text()
    body = section(text, "versions")
    contradicted = text.replace(body, body + "\nThe run above found that torch 2.14.1 did not build.\n")
    assert version_status_errors(contradicted) == [
        "torch 2.14.1: its row says passed, and: The run above found that torch 2.14.1 did not build."
    ]


# -- what is not yet measured is not in a table ----------------------------------------------
#
# benchmarks.md's "Not yet measured" may not say that more than K machines never ran while a
# table of the same doc has a layout of more machines, unless it names that layout.

_LAYOUT_CELL = re.compile(r"^\|\s*(\d+) x (\d+)\s*\|", re.MULTILINE)


def unmeasured_layout_errors(markdown: str) -> list[str]:
    measured = {(int(m), int(r)) for m, r in _LAYOUT_CELL.findall(markdown)}
    errors = []
    for sentence in _sentences(section(markdown, "not-yet-measured").splitlines()):
        for bound in re.findall(r"more than (\d+) machines", sentence):
            for machines, ranks in sorted(measured):
                named = re.search(rf"\b{machines} (machines|x {ranks})\b", sentence)
                if machines > int(bound) and not named:
                    errors.append(f"'more than {bound} machines' but {machines} x {ranks} has a row")
    return sorted(set(errors))


def test_not_yet_measured_names_no_layout_a_table_has() -> None:
    assert unmeasured_layout_errors((ROOT / "docs" / "benchmarks.md").read_text()) == []


def test_the_unmeasured_check_flags_a_layout_with_rows() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    body = section(text, "not-yet-measured")
    assert unmeasured_layout_errors(text.replace(body, "\n- Real clusters, more than 4 machines.\n")) == [
        "'more than 4 machines' but 8 x 1 has a row"
    ]


# --- every log line the docs show is made by a test (tests/documented_logs.py) ---------------------------


def test_every_log_line_the_docs_show_is_checked_against_a_line_a_test_made() -> None:
    lines = documented_log_lines()
    assert len(lines) >= 4, lines  # the rails' line twice, the failover warning, the summary
    missing = unclaimed(lines, claims())
    assert not missing, "no test makes these documented log lines: " + ", ".join(
        f"{line.doc}:{line.number}" for line in missing
    )


def test_the_log_line_check_flags_an_unclaimed_line_and_a_reworded_one(tmp_path: Path) -> None:
    doc = tmp_path / "guide.md"
    doc.write_text(
        "Example:\n\n"
        "    2026-12-01 09:14:02.315 host3:4120 [rank 3] fairring INFO: rank 3 (machine 1 of 2, rail 1):\n"
        "    rails on eth1 10.0.0.3 (FAIRRING_SOCKET_IFNAME 'eth' matches eth0, eth1);\n"
        "    rails transports uv | fork safety: ...\n\n"
        "    2026-12-01 09:14:02.315 host3:4120 [rank 3] fairring WARNING: interface eth1 is down: rank 3 moves ...\n"
    )
    rails, warning = documented_log_lines([doc])
    # A wrapped line is one line, whose continuation counts.
    assert (rails.level, rails.number, warning.number) == ("INFO", 3, 7) and "rails on" in rails.fixed_parts()
    assert "rails transports uv | fork safety:" in rails.fixed_parts()
    # Claimed by a text of the line and its doc's path only.
    claimed = {(str(doc), "rails on eth")}
    assert unclaimed([rails, warning], claimed) == [warning]
    assert unclaimed([rails, warning], {("docs/other.md", "rails on eth")}) == [rails, warning]
    # Values differ freely; fixed text and the level may not.
    made = "rank 0 (machine 0 of 4, rail 0): rails on ib0 10.9.9.9 (FAIRRING_SOCKET_IFNAME 'ib' matches ib0, ib1, ib2)"
    assert misreadings(made + "; rails transports uv | fork safety: safe: set", rails) == []
    assert misreadings(made + "; rails transports uv, ibv | fork safety: safe", rails) != []
    prefix = "2026-12-07 11:00:00.000 vm:1 [rank 3] fairring "
    assert misreadings(prefix + "WARNING: interface eth0 is down: rank 1 moves its rails", warning) == []
    assert misreadings(prefix + "INFO: interface eth0 is down: rank 1 moves its rails", warning) == [
        "level INFO, documented WARNING"
    ]
    assert misreadings(prefix + "WARNING: interface eth0 went down: rank 1 moves", warning) != []
