"""NCCL's list grammar, as NCCL_SOCKET_IFNAME and NCCL_IB_HCA read it.

A comma-separated list of entries; a leading `^` makes it a list of what to
leave out, and a leading `=` (after any `^`) makes its names exact rather than
prefixes. Both apply to the whole list. FAIRRING_SOCKET_IFNAME and
FAIRRING_IB_HCA share it (both parsed in fairring/_config.py).
"""

from __future__ import annotations


def split_list(raw: str) -> tuple[bool, bool, list[str]]:
    """(exclude, exact, entries) of `raw`; entries are stripped, empty ones kept for the caller to judge."""
    text = raw.strip()
    exclude = text.startswith("^")
    text = text.removeprefix("^")
    exact = text.startswith("=")
    text = text.removeprefix("=")
    return exclude, exact, [entry.strip() for entry in text.split(",")]


def names_match(name: str, listed: str, exact: bool) -> bool:
    """Whether `name` is the list entry `listed`: equal to it if exact, else starting with it."""
    return name == listed if exact else name.startswith(listed)
