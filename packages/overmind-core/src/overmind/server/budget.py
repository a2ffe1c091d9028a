"""The server's memory budget: how many bytes of entries it may hold (``OVERMIND_MAX_BYTES``).

>>> parse_size("512M")
536870912
"""
from __future__ import annotations

import re

ENV_MAX_BYTES = "OVERMIND_MAX_BYTES"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse ``"1048576"``, ``"512K"``, ``"1.5G"``, ``"2GiB"`` (binary units) into bytes."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(
            f"cannot read {text!r} as a size; write a number of bytes with an optional K, M, G or T suffix, "
            f"e.g. {ENV_MAX_BYTES}=8G"
        )
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.upper()])


def mem_total_bytes() -> int:
    """Physical memory from /proc/meminfo, or 8 GiB where that cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def max_bytes_from_env() -> int:
    """The budget: ``OVERMIND_MAX_BYTES`` if set, else half of physical memory."""
    from ..settings import current

    return current().max_bytes or mem_total_bytes() // 2  # a bad value warned there and reads as unset
