"""fairring._sizes: the one parser and formatter of sizes and rates (settings, the bench, the model)."""

from __future__ import annotations

import pytest

from fairring._config import ConfigError
from fairring._sizes import MiB, format_bytes, format_rate, format_size, parse_rate, parse_size


def test_rates_and_sizes_parse() -> None:
    assert parse_rate("1gbit") == 125e6
    assert parse_rate("500mbit") == 62.5e6
    assert parse_rate("1mibit") == 2**20 / 8
    assert parse_rate("100mbps") == 100e6
    assert parse_size("--sizes", "3276800") == 3276800
    assert parse_size("--sizes", "200MiB") == 200 * MiB
    with pytest.raises(ValueError, match="tc rate"):
        parse_rate("fast")


@pytest.mark.parametrize(
    ("count", "text"),
    [(64 * MiB, "64 MiB"), (3 * MiB + MiB // 5, "3.2 MiB"), (1000, "1000 B"), (1023 * 1024, "1023 KiB"), (0, "0 B")],
)
def test_bytes_read_at_a_glance(count: int, text: str) -> None:
    assert format_bytes(count) == text


def test_rates_read_as_people_say_them() -> None:
    assert [format_rate(rate) for rate in ("1gbit", "100mbit", "10kbit", "8")] == [
        "1 Gbit/s",
        "100 Mbit/s",
        "10 kbit/s",
        "8 bit/s",
    ]


# --- settings' sizes: parse_size and format_size, as fairring._config reads and writes them ---------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("26214400", 26214400),
        ("25MiB", 25 * 2**20),
        ("25mib", 25 * 2**20),
        ("50M", 50 * 2**20),
        (" 50 M ", 50 * 2**20),
        ("4K", 4096),
        ("4KB", 4000),
        ("1.5GiB", 3 * 2**29),
        ("2G", 2 * 2**30),
        ("1GB", 10**9),
        ("1T", 2**40),
        ("512B", 512),
    ],
)
def test_parse_size_accepts(raw: str, expected: int) -> None:
    assert parse_size("FAIRRING_SLICE_SIZE", raw) == expected


@pytest.mark.parametrize(
    "raw", ["", "abc", "25 bananas", "-5", "0", "0MiB", "1.5", "0.1K", "1e6", "12 MiB extra", "MiB"]
)
def test_parse_size_rejects_with_variable_value_and_accepted_forms(raw: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_size("FAIRRING_SLICE_SIZE", raw)
    message = str(error.value)
    assert f"FAIRRING_SLICE_SIZE={raw!r}" in message
    assert "e.g. 25MiB" in message


@pytest.mark.parametrize(
    ("size", "text"), [(25 * 2**20, "25MiB"), (2**30, "1GiB"), (4096, "4KiB"), (1000, "1000B"), (0, "0B")]
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text
