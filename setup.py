"""Build fairring's C++ extension against the installed torch.

The CUDA path (the CUDA device context of the engine, and TensorPipe's CUDA
channels for the rails) is compiled whenever torch is a CUDA build and the
CUDA runtime and crt headers can be found, including on machines without a
GPU. NCCL headers are not needed: NCCL groups are made in Python.
FAIRRING_WITH_CUDA selects it: "auto" (default), "1" (required: the build
fails, saying what is missing, if it cannot be built) or "0" (CPU only).

FAIRRING_WITH_TENSORPIPE selects the TensorPipe rails the same way: "auto"
(default: where torch ships TensorPipe's headers), "1" or "0" (the rails then
run only over NIXL, FAIRRING_RAILS_TRANSPORT=nixl).

FAIRRING_SANITIZE builds an instrumented extension, for tests only (`make
sanitize` builds it out of tree and runs tests against it): the sanitizers to
compile in, as -fsanitize= takes them, e.g. "address,undefined". It adds
-fsanitize=<list>, -fno-sanitize-recover=all (the first finding ends the
process), -fno-wrapv, -fno-omit-frame-pointer and -O1 -g1 to the compile
flags and -fsanitize=<list> to the link flags. The module then needs the
sanitizer runtimes, which must be preloaded into a Python not built with them
(see the Makefile's `sanitize` target). Unset or empty: the normal build,
unchanged.

Install with `pip install --no-build-isolation .`: the extension must be built
against the torch it will run with.

FAIRRING_PCH=0 builds without precompiling torch's headers (csrc/torch_headers.h;
see BuildExtensionWithPch below). FAIRRING_UNITY=0 compiles each source file as a
translation unit of its own, instead of a few of one folder together (_unity_units).

FAIRRING_WITH_EXTENSION=0 leaves the extension out: `make` installs the
checkout editable that way (its metadata, so that torch finds the
`torch.distributed.backends` entry point) and builds the extension in place
itself, where a one-file change rebuilds one file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from setuptools import find_packages, setup

# What a build front end's isolated environment has in its path: pip's (its venv is sys.prefix, or its
# overlay is on sys.path), pypa/build's venv ("build-env-") and uv's build venvs ("builds-v0").
ISOLATED_BUILD_MARKERS = ("pip-build-env-", "build-env-", "builds-v0")


def torch_import_failure(error: ImportError, prefix: str, path: list[str]) -> str:
    """Why torch does not import, and what to do: isolation hid it, it is not installed, or it is broken."""
    if not (isinstance(error, ModuleNotFoundError) and error.name == "torch"):
        return f"fairring: torch does not import in this environment ({sys.executable}): {error}"
    isolated = next((entry for entry in [prefix, *path] if any(m in entry for m in ISOLATED_BUILD_MARKERS)), None)
    if isolated:
        return (
            f"fairring: torch is hidden: this build runs in an isolated build environment ({isolated}), which "
            "sees none of the installed packages. fairring must be compiled against the torch it will run "
            "with, so build it without isolation, in the environment that has torch: "
            "`pip install --no-build-isolation .` (or `pip wheel --no-build-isolation --no-deps -w dist .`)"
        )
    return (
        f"fairring: torch is not installed in this environment ({sys.executable}). Install the torch "
        "fairring will run with (e.g. `pip install torch==2.15.0`), then build with "
        "`pip install --no-build-isolation .`"
    )


try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as error:
    sys.exit(torch_import_failure(error, sys.prefix, sys.path))

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
COMMON_SOURCES = [
    "backend/allreduce.cpp",
    "backend/allreduce_args.cpp",
    "backend/backend.cpp",
    "backend/chunked_collectives.cpp",
    "backend/chunked_pack.cpp",
    "backend/engine_factory.cpp",
    "backend/delegated.cpp",
    "backend/delegated_collectives.cpp",
    "backend/engines.cpp",
    "backend/group_life.cpp",
    "backend/hooks.cpp",
    "backend/ledger.cpp",
    "backend/memory_order.cpp",
    "backend/pending_report.cpp",
    "backend/premul.cpp",
    "backend/reconfigurable.cpp",
    "backend/usage.cpp",
    "backend/work.cpp",
    "bindings/backend.cpp",
    "bindings/engine_parts.cpp",
    "bindings/module.cpp",
    "bindings/settings.cpp",
    "device/capture.cpp",
    "device/device.cpp",
    "device/emulated.cpp",
    "device/nccl_delegate_model.cpp",
    "device/streamed.cpp",
    "engine/completions.cpp",
    "engine/engine.cpp",
    "engine/failures.cpp",
    "engine/follow_device.cpp",
    "engine/footprint.cpp",
    "engine/plan.cpp",
    "engine/slices.cpp",
    "engine/slice_memory.cpp",
    "engine/slice_rails.cpp",
    "engine/staging.cpp",
    "engine/trace.cpp",
    "local/group_steps.cpp",
    "local/shared_memory.cpp",
    "log.cpp",
    "rails/auth/crypto.cpp",
    "rails/auth/rails_key.cpp",
    "rails/auth/sealed.cpp",
    "rails/failover.cpp",
    "rails/interfaces.cpp",
    "rails/lanes.cpp",
    "rails/mesh_factory.cpp",
    "rails/nixl/agent.cpp",
    "rails/nixl/control_link.cpp",
    "rails/nixl/data_link.cpp",
    "rails/nixl/library.cpp",
    "rails/nixl/mesh.cpp",
    "rails/nixl/peers.cpp",
    "rails/nixl/progress.cpp",
    "rails/nixl/wire.cpp",
    "rails/tensorpipe/wire.cpp",
    "rails/watch.cpp",
    "reduction.cpp",
    "test_switches.cpp",
    "testing/bindings.cpp",
    "testing/rails_bindings.cpp",
    "testing/fake_nixl.cpp",
    "testing/fake_nixl_transfers.cpp",
    "testing/fake_nixl_pair.cpp",
    "topology.cpp",
]
# The sources that see CUDA headers, and their CPU-only twins.
CUDA_SOURCES = ["device/cuda.cpp", "device/cuda_signals.cpp"]
CPU_ONLY_SOURCES = ["device/cuda_none.cpp"]
# The TensorPipe rails and their harnesses; without TensorPipe, what stands in for them.
TENSORPIPE_SOURCES = [
    "rails/tensorpipe/acceptor.cpp",
    "rails/tensorpipe/connection.cpp",
    "rails/tensorpipe/dial_handshakes.cpp",
    "rails/tensorpipe/factory.cpp",
    "rails/tensorpipe/handshake.cpp",
    "rails/tensorpipe/pipe_cipher.cpp",
    "rails/tensorpipe/mesh.cpp",
    "rails/tensorpipe/rail_switch.cpp",
    "testing/endpoint.cpp",
    "testing/tensorpipe_bindings.cpp",
    "testing/wire_probe.cpp",
]
TENSORPIPE_CUDA_SOURCES = {True: ["rails/tensorpipe/cuda.cpp"], False: ["rails/tensorpipe/cuda_none.cpp"]}
NO_TENSORPIPE_SOURCES = ["rails/tensorpipe/none.cpp"]
# Source files compiled together in one translation unit, at most this many of one folder.
UNITY_BATCH = 5


@dataclass
class CudaBuild:
    include_dirs: list[str] = field(default_factory=list)
    library_dirs: list[str] = field(default_factory=list)
    libraries: list[str] = field(default_factory=list)


def _find_dir(candidates: list[Path], marker: str) -> Path | None:
    for candidate in candidates:
        if (candidate / marker).exists():
            return candidate
    return None


def _nvidia_package_roots() -> list[Path]:
    """Where pip's nvidia-* wheels (which torch depends on) put their files."""
    try:
        import nvidia
    except ImportError:
        return []
    return [Path(p) for p in nvidia.__path__]


def _locate_cuda() -> tuple[CudaBuild | None, list[str]]:
    """The CUDA build settings, or None and what is missing."""
    if torch.version.cuda is None:
        return None, [f"torch {torch.__version__} is a CPU-only build"]
    cuda_major = torch.version.cuda.split(".")[0]
    roots = _nvidia_package_roots()
    include_candidates: list[Path] = []
    lib_candidates: list[Path] = []
    cuda_home = os.environ.get("CUDA_HOME")
    if cuda_home:
        include_candidates.append(Path(cuda_home) / "include")
        lib_candidates += [Path(cuda_home) / "lib64", Path(cuda_home) / "lib"]
    for root in roots:
        include_candidates.append(root / f"cu{cuda_major}" / "include")
        lib_candidates.append(root / f"cu{cuda_major}" / "lib")

    missing = []
    found: list[Path] = []
    for marker, hint in [
        ("cuda_runtime_api.h", f"the CUDA runtime headers (pip: nvidia-cuda-runtime, CUDA {torch.version.cuda})"),
        ("crt/host_config.h", f"the CUDA crt headers (pip: nvidia-cuda-crt=={torch.version.cuda}.*)"),
    ]:
        directory = _find_dir(include_candidates, marker)
        if directory is None:
            missing.append(f"{marker}: install {hint} or set CUDA_HOME")
        else:
            found.append(directory)
    libraries = []
    library_dirs: list[Path] = []
    for soname in [f"libcudart.so.{cuda_major}"]:
        directory = _find_dir(lib_candidates, soname)
        if directory is None:
            missing.append(f"{soname}: not found next to the headers")
        else:
            library_dirs.append(directory)
            libraries.append(f":{soname}")
    if missing:
        return None, missing
    build = CudaBuild(
        include_dirs=sorted({str(d) for d in found}),
        library_dirs=sorted({str(d) for d in library_dirs}),
        libraries=[*libraries, "c10_cuda", "torch_cuda"],
    )
    return build, []


def _build_mode(variable: str) -> str:
    """A FAIRRING_WITH_* variable: "auto" (the default), "1" (required) or "0" (left out)."""
    mode = os.environ.get(variable, "auto").strip().lower()
    if mode not in {"auto", "0", "1"}:
        sys.exit(f"fairring: {variable}={mode!r}; use auto, 1 or 0")
    return mode


def _cuda_build() -> CudaBuild | None:
    mode = _build_mode("FAIRRING_WITH_CUDA")
    if mode == "0":
        print("fairring: building the CPU-only extension (FAIRRING_WITH_CUDA=0)")
        return None
    build, missing = _locate_cuda()
    if build is None:
        report = "\n  ".join(missing)
        if mode == "1":
            sys.exit(f"fairring: FAIRRING_WITH_CUDA=1 but the CUDA path cannot be built:\n  {report}")
        if torch.version.cuda is None:
            print(f"fairring: building without the CUDA path:\n  {report}")
        else:
            # A CUDA torch without fairring's CUDA path sends every CUDA tensor to NCCL alone:
            # stderr and a banner, since pip shows a build's stdout only with -v.
            banner = "=" * 78
            print(
                f"{banner}\nWARNING: fairring is being built WITHOUT its CUDA path, although torch "
                f"{torch.__version__} has CUDA {torch.version.cuda}:\n  {report}\nfairring.build_info()"
                f'["cuda_path"] will be False. Set FAIRRING_WITH_CUDA=1 to make this an error.\n{banner}',
                file=sys.stderr,
            )
        return None
    print(f"fairring: building the CUDA path (CUDA {torch.version.cuda}, headers in {build.include_dirs})")
    return build


def _with_tensorpipe() -> bool:
    """Whether to build the TensorPipe rails: FAIRRING_WITH_TENSORPIPE, by default where torch ships its headers."""
    mode = _build_mode("FAIRRING_WITH_TENSORPIPE")
    headers = Path(torch.utils.cpp_extension.include_paths()[0]) / "tensorpipe" / "tensorpipe.h"
    if mode == "0":
        print("fairring: building without the TensorPipe rails (FAIRRING_WITH_TENSORPIPE=0): NIXL carries them")
        return False
    if not headers.is_file():
        if mode == "1":
            sys.exit(f"fairring: FAIRRING_WITH_TENSORPIPE=1, but torch {torch.__version__} has no {headers}")
        print(f"fairring: torch {torch.__version__} ships no TensorPipe ({headers}): the rails will use NIXL")
        return False
    return True


def _sanitizer_flags() -> tuple[list[str], list[str]]:
    """Compile and link flags for FAIRRING_SANITIZE (empty when unset)."""
    value = os.environ.get("FAIRRING_SANITIZE", "").strip()
    if not value:
        return [], []
    names = [name.strip() for name in value.split(",") if name.strip()]
    for name in names:
        if not name.replace("-", "").replace("_", "").isalnum():
            sys.exit(f"fairring: FAIRRING_SANITIZE={value!r}: {name!r} is not a sanitizer name")
    sanitize = "-fsanitize=" + ",".join(names)
    print(f"fairring: building an instrumented extension for tests ({sanitize})")
    # These come after Python's CFLAGS (-fwrapv -O3 -g) and the -O2 below, so they
    # win. -fno-wrapv: Python's -fwrapv defines signed overflow, which would turn
    # UBSan's signed-integer-overflow check off. -O1 keeps reports close to the
    # source; -g1 (line tables) is all a report's stacks need and compiles in 60%
    # of -g's time; frame pointers give whole stacks.
    compile_args = [sanitize, "-fno-sanitize-recover=all", "-fno-wrapv", "-fno-omit-frame-pointer", "-O1", "-g1"]
    return compile_args, [sanitize]


def _torch_feature_flags() -> list[str]:
    """What of c10d's Backend this torch declares, where no header's presence tells.

    torch 2.14 has Hooks.hpp with abort hooks only; completion hooks, completion keys and the
    supports* queries came with 2.15 (csrc/backend/hooks.h).
    """
    backend = Path(torch.utils.cpp_extension.include_paths()[0]) / "torch/csrc/distributed/c10d/Backend.hpp"
    declares = backend.read_text() if backend.is_file() else ""
    return [f"-DFAIRRING_HAS_BACKEND_HOOKS={int('supportsCompletionHooks' in declares)}"]


def _extension() -> CppExtension:
    cuda = _cuda_build()
    sources = [*COMMON_SOURCES, *(CUDA_SOURCES if cuda else CPU_ONLY_SOURCES)]
    if _with_tensorpipe():
        sources += [*TENSORPIPE_SOURCES, *TENSORPIPE_CUDA_SOURCES[cuda is not None]]
    else:
        sources += NO_TENSORPIPE_SOURCES
    sanitize_compile, sanitize_link = _sanitizer_flags()
    return CppExtension(
        name="fairring._C",
        sources=[str(Path("csrc") / s) for s in sources],
        include_dirs=[str(CSRC)] + (cuda.include_dirs if cuda else []),
        library_dirs=cuda.library_dirs if cuda else [],
        libraries=cuda.libraries if cuda else [],
        # torch's CUDA headers trip -Winterference-size; it says nothing about our code.
        # Hidden visibility, as pybind11 asks of a module: fairring's own symbols stay inside
        # _C (PyInit__C is exported; no other library links against the rest), and pybind11's
        # class_ is not more visible than its hidden base (-Wattributes).
        extra_compile_args=[
            "-std=c++20",
            "-O2",
            "-Wall",
            "-Wno-unused-parameter",
            "-Wno-interference-size",
            "-fvisibility=hidden",
            # Python's CFLAGS add -g, a third of each file's compile time; torch ships without
            # debug info too. The sanitizer flags, after these, put line tables back.
            "-g0",
            "-Winvalid-pch",
            *_torch_feature_flags(),
            *sanitize_compile,
        ],
        extra_link_args=sanitize_link,
    )


class BuildExtensionWithPch(BuildExtension):
    """torch's BuildExtension, with csrc/torch_headers.h precompiled first.

    The .gch goes in the build's temporary folder, which then comes first on the include path, so
    that GCC takes it for `#include <torch_headers.h>` (angle brackets: a quoted include would find
    csrc's plain header first). It is compiled with the extension's own flags, so each build (in
    place, oldest torch, sanitizers, wheel) makes its own. Measured on 2 cores: the translation
    units that include it compile in about half the time (docs/design.md, "Build time").
    FAIRRING_PCH=0, or a compiler that cannot make one, builds without: the header is then read as
    any other, and GCC's -Winvalid-pch says where a precompiled one was refused.
    """

    def build_extension(self, ext: CppExtension) -> None:
        if os.environ.get("FAIRRING_PCH", "1") != "0":
            self._precompile_torch_headers(ext)
        if os.environ.get("FAIRRING_UNITY", "1") != "0":
            ext.sources = _unity_units(ext.sources, Path(self.build_temp).resolve() / "unity")
        super().build_extension(ext)

    def _precompile_torch_headers(self, ext: CppExtension) -> None:
        folder = Path(self.build_temp).resolve() / "pch"
        folder.mkdir(parents=True, exist_ok=True)
        flags = ext.extra_compile_args["cxx"] if isinstance(ext.extra_compile_args, dict) else ext.extra_compile_args
        includes = [f"-I{Path(d).resolve()}" for d in [*ext.include_dirs, *self.compiler.include_dirs]]
        compiler = [os.environ.get("CXX", "c++"), *self.compiler.compiler_so[1:]]
        header = CSRC / "torch_headers.h"
        gch = folder / "torch_headers.h.gch"
        command = [*compiler, *includes, "-x", "c++-header", str(header), "-o", str(gch), *flags]
        # Made again only when the header, the flags or torch changed. Then every object goes too:
        # GCC's dependency lists name neither a precompiled header nor what it holds, so ninja
        # would keep objects compiled against the old one.
        stamp = folder / "torch_headers.stamp"
        torch_installed = str(Path(torch.__file__).stat().st_mtime_ns)
        recipe = "\n".join([torch.__version__, torch.__file__, torch_installed, header.read_text(), *command])
        # A unit of several sources (_unity_units) includes the precompiled header first; its
        # sources' own includes of it, which GCC cannot serve from the .gch again, find this.
        _write_if_changed(folder / "torch_headers.h", f'#pragma once\n#include "{header}"\n')
        if gch.is_file() and stamp.is_file() and stamp.read_text() == recipe:
            ext.include_dirs.insert(0, str(folder))
            return
        stamp.unlink(missing_ok=True)
        for stale in Path(self.build_temp).rglob("*.o"):
            stale.unlink()
        try:
            # Its output is torch's own header warnings, which the translation units do not repeat.
            subprocess.run(command, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", "") or ""
            print(f"fairring: building without precompiled torch headers ({error})\n{detail}", file=sys.stderr)
            return
        stamp.write_text(recipe)
        ext.include_dirs.insert(0, str(folder))


def _write_if_changed(path: Path, text: str) -> None:
    """A generated file the units depend on: rewritten only when its text changes, since a new
    modification time makes ninja recompile whatever depends on it."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def _unity_units(sources: list[str], folder: Path) -> list[str]:
    """The translation units to compile: the sources of each folder, in order, UNITY_BATCH at a time.

    Most of a file's compile time is torch's and pybind11's headers, not fairring's code, so the
    files split by job (docs/design.md, "Source tree") would each pay for them again: a unit of
    a few files pays once (docs/design.md, "Build time"). A unit is a generated file in the build's
    temporary folder that includes its sources (rewritten only when that list changes), and a
    change to one source recompiles its unit. The sources that see CUDA's headers stay units of
    their own, so that no other file sees them.
    """
    alone = {str(Path("csrc") / s) for s in [*CUDA_SOURCES, *TENSORPIPE_CUDA_SOURCES[True]]}
    by_folder: dict[str, list[str]] = {}
    for source in sources:
        by_folder.setdefault("" if source in alone else str(Path(source).parent), []).append(source)
    units = list(by_folder.pop("", []))
    folder.mkdir(parents=True, exist_ok=True)
    for directory, members in by_folder.items():
        for start in range(0, len(members), UNITY_BATCH):
            batch = members[start : start + UNITY_BATCH]
            if len(batch) == 1:
                units += batch
                continue
            # The precompiled torch headers count only as a unit's first include.
            text = "#include <torch_headers.h>\n" + "".join(f'#include "{(ROOT / m).resolve()}"\n' for m in batch)
            unit = folder / f"{directory.replace('/', '_')}_{start // UNITY_BATCH}.cpp"
            _write_if_changed(unit, text)
            units.append(str(unit))
    return units


def _version() -> str:
    """fairring/_version.py holds the version; read, not imported (that would load the extension)."""
    namespace: dict[str, str] = {}
    exec((ROOT / "fairring" / "_version.py").read_text(), namespace)
    return namespace["__version__"]


# pyproject.toml's [project] holds the metadata; setup() gives only the fields it lists as dynamic.
setup(
    version=_version(),
    license="BSD-3-Clause",
    packages=find_packages(include=["fairring", "fairring.*"]),
    # The typed API (PEP 561): the marker, and the extension's stub (tests/test_typed_api.py).
    package_data={"fairring": ["py.typed", "_C.pyi"]},
    install_requires=[f"torch=={torch.__version__.split('+')[0]}"],
    ext_modules=[_extension()] if os.environ.get("FAIRRING_WITH_EXTENSION", "1") != "0" else [],
    cmdclass={"build_ext": BuildExtensionWithPch},
)
