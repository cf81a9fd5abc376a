"""Whether the NIXL rails can run here, and the environment that selects them, for the tests."""

from __future__ import annotations

import pytest

NIXL_ENV = {"FAIRRING_RAILS_TRANSPORT": "nixl"}


def _why_nixl_is_missing() -> str:
    try:
        from fairring._nixl import nixl_library

        nixl_library()
    except Exception as error:  # any reason it cannot load skips, and says why
        return str(error)
    return ""


NIXL_MISSING = _why_nixl_is_missing()
needs_nixl = pytest.mark.skipif(bool(NIXL_MISSING), reason=f"NIXL is not usable here: {NIXL_MISSING}")

# Both transports, for tests that run on each; the NIXL case skips, saying why, where it cannot run.
RAILS_TRANSPORTS = ["tensorpipe", pytest.param("nixl", marks=needs_nixl)]


def rails_env(transport: str) -> dict[str, str]:
    """The ranks' environment for `transport`, named even for the default (the suite may run under NIXL)."""
    env = {"FAIRRING_RAILS_TRANSPORT": transport}
    if transport == "nixl":
        # NIXL and UCX start threads with each agent, and glibc gives new threads new malloc arenas
        # (up to 8 per core), which grow RSS for the first dozen groups without leaking: capped, RSS
        # is flat after a few (tests/test_lifecycle.py), so growth checks measure leaks only.
        env["MALLOC_ARENA_MAX"] = "2"
    return env
