"""fairring.sizes: the one parser and formatter of sizes and rates (settings, the bench, the model)."""

from __future__ import annotations

import pytest

from fairring.sizes import MiB, format_bytes, format_rate, parse_rate, parse_size


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
