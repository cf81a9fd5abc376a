"""fairring against every supported torch (`make test-torch-versions`): install, build, import, 2x2 smoke.

For each version: a virtual environment of its own (.venv-torch/<version>, kept
between runs) with that torch from PyPI and the CUDA crt headers of its CUDA; the
extension built out of tree, CUDA path included (build/torch-<version>); its
build_info() read; then the smoke, pytest on SMOKE_TESTS: every c10d collective
through fairring, and the engine's all-reduce, reduce-scatter and all-gather
with fairring.summary() on 2 machines x 2 ranks. Prints one row per version and
writes the table to build/torch-versions.md. CI builds and tests only the oldest
(`make test-oldest`) and the newest (`make test`); this covers the ones between.

    python benchmarks/torch_versions.py                       # every supported version
    python benchmarks/torch_versions.py --versions 2.13.0     # one
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUPPORTED = ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
SMOKE_TESTS = ("tests/test_build.py", "tests/test_collectives.py", "tests/test_summary.py")
TEST_TOOLS = ("ninja", "numpy", "pytest>=8", "pytest-timeout>=2.3")


@dataclass
class Outcome:
    version: str
    stage: str  # the last stage reached: install, build, import, smoke, passed
    detail: str
    seconds: float


def run(command: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT) -> bool:
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        return subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode == 0


def last_line(log: Path, containing: str = "") -> str:
    lines = [line for line in log.read_text().splitlines() if containing in line]
    return lines[-1].strip() if lines else ""


def one_version(version: str, log: Path) -> Outcome:
    started = time.monotonic()
    venv = ROOT / ".venv-torch" / version
    python = str(venv / "bin" / "python")

    def outcome(stage: str, detail: str) -> Outcome:
        return Outcome(version, stage, detail, time.monotonic() - started)

    if not (venv / ".installed").exists():
        installed = run([sys.executable, "-m", "venv", str(venv)], log) and run(
            [python, "-m", "pip", "install", "--quiet", f"torch=={version}", *TEST_TOOLS], log
        )
        cuda = subprocess.run(
            [python, "-c", "import torch; print(torch.version.cuda or '')"], capture_output=True, text=True
        ).stdout.strip()
        if installed and cuda:
            installed = run([python, "-m", "pip", "install", "--quiet", f"nvidia-cuda-crt=={cuda}.*"], log)
        if not installed:
            return outcome("install", last_line(log) or "pip failed")
        (venv / ".installed").touch()
    out = ROOT / "build" / f"torch-{version}"
    shutil.rmtree(out, ignore_errors=True)
    # The package without the checkout's extension, which was built against another torch.
    shutil.copytree(ROOT / "fairring", out / "fairring", ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    env = {**os.environ, "FAIRRING_WITH_CUDA": "1", "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
    build = [python, "setup.py", "--quiet", "build_ext", "--build-lib", str(out), "--build-temp", f"{out}-temp"]
    if not run(build, log, env):
        return outcome("build", last_line(log, "error") or last_line(log))
    check = "import fairring, torch; i = fairring.build_info(); assert i['cuda_path'], i; print(torch.__version__, i)"
    # From the build folder: `python -c` puts its working folder first on sys.path, and the checkout's
    # fairring/ holds the extension built against another torch.
    if not run([python, "-c", check], log, env, cwd=out):
        return outcome("import", last_line(log))
    # pytest's own script, not `python -m pytest`, which would put the checkout first on sys.path too.
    smoke = [str(venv / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", "-o", f"pythonpath={out}", *SMOKE_TESTS]
    if not run(smoke, log, env):
        return outcome("smoke", last_line(log, "failed") or last_line(log))
    return outcome("passed", last_line(log, "passed"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", nargs="+", default=list(SUPPORTED), help="torch versions, from PyPI")
    args = parser.parse_args()
    (ROOT / "build").mkdir(exist_ok=True)
    rows = ["| torch | reached | seconds | last line |", "|---|---|---|---|"]
    failed = False
    for version in args.versions:
        log = ROOT / "build" / f"torch-{version}.log"
        log.write_text("")
        result = one_version(version, log)
        failed |= result.stage != "passed"
        rows.append(f"| {version} | {result.stage} | {result.seconds:.0f} | {result.detail} |")
        print(rows[-1], f"(log: {log.relative_to(ROOT)})", flush=True)
    table = "\n".join(rows)
    (ROOT / "build" / "torch-versions.md").write_text(table + "\n")
    print(table)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
