"""Init time against Gloo, by world size, with this checkout's fairring: fairring/bench/init_time.py.

    python benchmarks/init_time.py [--worlds 4 8 16] [--ranks-per-machine 4] [--repeats 3]

is `python -m fairring.bench.init_time` (see its --help); tests/test_init_time.py is its smoke test.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairring.bench.init_time import entry

if __name__ == "__main__":
    sys.exit(entry())
