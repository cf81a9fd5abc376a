"""Sizes and rates as people write them: one parser and one formatter of each.

Settings and the benchmark's options take sizes ('25MiB', '50M', '26214400') and tc rates
('1gbit'); settings are echoed back exactly (format_size), reports read at a glance
(format_bytes, format_rate).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from ._errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Binary multiples for the bare letter and the "i" forms (as NCCL and most ML
# tooling read "50M"), decimal ones for the SI forms.
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB, "kib": KiB, "kb": 1000,
    "m": MiB, "mib": MiB, "mb": 1000**2,
    "g": GiB, "gib": GiB, "gb": 1000**3,
    "t": 1024 * GiB, "tib": 1024 * GiB, "tb": 1000**4,
}  # fmt: skip
# tc's rate units, in bytes per second: bits (a bare number too), and bytes for the "bps" forms.
_RATE_UNITS = {"": 1 / 8, "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8}
_RATE_UNITS |= {"kibit": 2**10 / 8, "mibit": 2**20 / 8, "gibit": 2**30 / 8, "tibit": 2**40 / 8}
_RATE_UNITS |= {"bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12}
_RATE_UNITS |= {"kibps": 2**10, "mibps": 2**20, "gibps": 2**30, "tibps": 2**40}
_NUMBER_UNIT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")
SIZE_HELP = (
    "a byte count (e.g. 26214400) or a number with a unit: B, K/KiB, M/MiB, "
    "G/GiB, T/TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000), e.g. 25MiB"
)
_BINARY_UNITS = (("GiB", GiB), ("MiB", MiB), ("KiB", KiB))


def parse_size(name: str, raw: str, allow_zero: bool = False) -> int:
    """Bytes in `raw`, the value of `name` (a variable or an option); ConfigError if invalid."""
    match = _NUMBER_UNIT.fullmatch(raw)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ConfigError(f"{name}={raw!r} is not a size; expected {SIZE_HELP}")
    try:
        size = Decimal(match.group(1)) * _SIZE_UNITS[unit]
    except InvalidOperation as error:  # pragma: no cover - the pattern admits only numbers
        raise ConfigError(f"{name}={raw!r} is not a size; expected {SIZE_HELP}") from error
    if size != size.to_integral_value():
        raise ConfigError(f"{name}={raw!r} is not a whole number of bytes; expected {SIZE_HELP}")
    if size < 0 or (size == 0 and not allow_zero):
        raise ConfigError(f"{name}={raw!r} must be larger than zero; expected {SIZE_HELP}")
    return int(size)


def format_size(size: int) -> str:
    """`size` bytes exactly, in the largest binary unit that divides it, e.g. '25MiB'."""
    if size == 0:
        return "0B"
    for unit, scale in _BINARY_UNITS:
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def format_bytes(count: float) -> str:
    """`count` bytes to three figures, in the largest binary unit it reaches, e.g. '3.2 MiB'."""
    unit, scale = next(((unit, scale) for unit, scale in _BINARY_UNITS if count >= scale), ("B", 1))
    value = count / scale
    return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"


def parse_rate(rate: str) -> float:
    """A tc rate ('1gbit', '500mbit'; a bare number is bits per second) in bytes per second."""
    match = _NUMBER_UNIT.fullmatch(rate)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _RATE_UNITS:
        raise ValueError(f"not a tc rate (like '1gbit' or '100mbit'): {rate!r}")
    return float(match.group(1)) * _RATE_UNITS[unit]


def format_rate(rate: str) -> str:
    """A tc rate as people say it: '1gbit' -> '1 Gbit/s'."""
    bits = parse_rate(rate) * 8
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g} {unit}"
    return f"{bits:g} bit/s"
