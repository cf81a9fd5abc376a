"""Run first by `make sanitize`: the tests after it import the instrumented extension.

`make sanitize` builds fairring._C with AddressSanitizer and UBSan into
build/sanitize and runs tests with that folder first on sys.path. This fails
the run unless both the test process and a rank spawned as benchmarks/harness.py
spawns them (multiprocessing's spawn, which hands its sys.path on) import that
build, rather than the in-place one in fairring/, and it links the sanitizer
runtimes.
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

SANITIZED = Path(__file__).resolve().parent.parent / "build" / "sanitize"


def where_fairring_comes_from() -> tuple[str, bool, bool]:
    """The extension's file, whether it needs libasan, and whether the ASan runtime is loaded."""
    from fairring import _C

    needs_asan = b"libasan.so" in Path(_C.__file__).read_bytes()
    asan_loaded = "libasan.so" in Path("/proc/self/maps").read_text()
    return _C.__file__, needs_asan, asan_loaded


def test_the_tests_import_the_sanitized_extension() -> None:
    here = where_fairring_comes_from()
    with mp.get_context("spawn").Pool(1) as pool:
        spawned = pool.apply(where_fairring_comes_from)
    for process, (file, needs_asan, asan_loaded) in (("the test process", here), ("a spawned rank", spawned)):
        print(f"{process}: fairring._C is {file}")
        assert Path(file).resolve().is_relative_to(SANITIZED), f"{process} imported {file}, not build/sanitize's"
        assert needs_asan, f"{file} is not linked against libasan: FAIRRING_SANITIZE was not set"
        assert asan_loaded, f"{process} runs without the ASan runtime"
