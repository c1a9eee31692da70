"""Sizes as people write them: bytes (4GiB, 512MiB, 1.5G, 2e9) and vLLM's counts (32k, 32K, 1m)."""

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


_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_human_int(value: str) -> int:
    """vLLM's human_readable_int: lower-case suffixes are powers of 1000 ('32k' -> 32000, '25.6k' -> 25600),
    upper-case ones powers of 1024 ('32K' -> 32768, whole numbers only); anything else must be a plain int."""
    text = value.strip()
    match = _HUMAN_INT.fullmatch(text)
    if match is None:
        return int(text)
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise ValueError(f"decimals are not allowed with binary suffixes like {suffix}: "
                         f"did you mean {number}{suffix.lower()}?")
    return int(number) * _BINARY[suffix]


def parse_cli_bytes(value: str) -> int:
    """A byte count on the command line: vLLM's form where it applies ('4G' = 4 GiB, '4g' = 4e9, '1.5G' refused),
    else parse_size's ('4GiB', '512MiB', '2e9')."""
    if _HUMAN_INT.fullmatch(value.strip()) or value.strip().isdigit():
        return parse_human_int(value)
    return parse_size(value)
