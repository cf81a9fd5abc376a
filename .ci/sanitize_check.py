"""Run first by `make sanitize`: the tests after it import the instrumented extension.

`make sanitize` builds fairring._C with AddressSanitizer and UBSan into
build/sanitize and runs tests with that folder first on sys.path. This fails
the run unless the test process, a spawned process (multiprocessing's spawn,
which hands its sys.path on) and a rank started as benchmarks/harness.py starts
them (forked from its fork server, or spawned) all import that build, rather
than the in-place one in fairring/, and it links the sanitizer runtimes.
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from benchmarks.harness import Layout, RankPool, start_fork_server

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
    start_fork_server()
    with RankPool(Layout(2, 1)).start(init=False) as ranks:
        rank = ranks.run(where_fairring_comes_from)[0]
    processes = (("the test process", here), ("a spawned process", spawned), ("a rank of the harness", rank))
    for process, (file, needs_asan, asan_loaded) in processes:
        print(f"{process}: fairring._C is {file}")
        assert Path(file).resolve().is_relative_to(SANITIZED), f"{process} imported {file}, not build/sanitize's"
        assert needs_asan, f"{file} is not linked against libasan: FAIRRING_SANITIZE was not set"
        assert asan_loaded, f"{process} runs without the ASan runtime"
