"""iproute2 for the GPU check on a machine that lacks it and has no network.

The GPU check's stage against NCCL makes each emulated machine a network
namespace with `ip` and shapes its NIC with `tc`. The lent GPU machine's image
(Ubuntu 24.04) has neither, and nothing there can reach a package mirror. So
`make gpu-tools`, run where the network is, downloads that release's iproute2
and the libraries it needs into `.gpu-tools/`, which the call to the GPU
machine carries. There, `provide` unpacks each package the machine does not
already have into a folder of its own (never over `/`: a package's `/bin` would
replace the image's `/bin -> usr/bin` link) and puts it first on this
process's PATH and LD_LIBRARY_PATH, which every stage's processes inherit.
Only packages missing from the machine are unpacked, so no library the image
has is shadowed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / ".gpu-tools"
TOOLS = ("ip", "tc")
# Where a package's programs and libraries land, relative to the folder it is unpacked into.
PROGRAM_DIRS = ("usr/sbin", "usr/bin", "sbin", "bin")
LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "usr/lib", "lib")


def _installed(package: str) -> bool:
    return subprocess.run(["dpkg", "-s", package], capture_output=True).returncode == 0


def _package(deb: Path) -> str:
    found = subprocess.run(["dpkg-deb", "-f", str(deb), "Package"], capture_output=True, text=True, check=True)
    return found.stdout.strip()


def provide(folder: Path = FOLDER, tools: tuple[str, ...] = TOOLS) -> str:
    """Makes `tools` runnable from `folder`'s packages where the machine lacks one; says what it did."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if not missing:
        return "installed"
    debs = sorted(folder.glob("*.deb"))
    if not debs:
        return f"{', '.join(missing)} missing, and no packages in {folder} (run `make gpu-tools` and carry it)"
    if shutil.which("dpkg-deb") is None:
        return f"{', '.join(missing)} missing, and no dpkg-deb to unpack {folder}'s packages"
    root = Path(tempfile.mkdtemp(prefix="fairring-gpu-tools-"))
    unpacked = []
    for deb in debs:
        package = _package(deb)
        if not _installed(package):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            unpacked.append(package)
    _prepend("PATH", [root / sub for sub in PROGRAM_DIRS])
    _prepend("LD_LIBRARY_PATH", [root / sub for sub in LIBRARY_DIRS])
    still = [tool for tool in tools if shutil.which(tool) is None]
    found = f"unpacked {', '.join(unpacked) or 'nothing'} from {folder} into {root}"
    return f"{found}; still missing: {', '.join(still)}" if still else found


def _prepend(variable: str, folders: list[Path]) -> None:
    present = [str(folder) for folder in folders if folder.is_dir()]
    if present:
        os.environ[variable] = os.pathsep.join([*present, *filter(None, [os.environ.get(variable)])])
