"""Byte sizes as people write them: 4GiB, 512MiB, 1.5G, 2e9 or a plain integer."""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_size(value: int | float | str) -> int:
    """Bytes from an int or a string: decimal units (K, M, G, T, optionally with B) or binary ones (KiB, MiB...)."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int | float):
        size = value
    else:
        match = _SIZE.match(value)
        if match is None:
            raise ValueError(f"not a size: {value!r} (expected e.g. 4GiB, 512MiB, 2G or a number of bytes)")
        size = float(match.group(1)) * _UNITS[(match.group(2) or "").lower()]
    if size < 0 or int(size) != size:
        raise ValueError(f"a size must be a whole, non-negative number of bytes, got {value!r}")
    return int(size)


def format_size(num_bytes: int) -> str:
    """4294967296 -> '4.00 GiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes} B"
