"""`python -m fairring.validate`: see fairring/validate/cli.py and docs/validating.md."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
