"""The errors fairring raises for a bad configuration, shared by the modules that parse it."""

from __future__ import annotations


class ConfigError(ValueError):
    """An environment variable holds a value fairring cannot use."""
