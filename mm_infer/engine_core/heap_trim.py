"""Hand freed heap memory back to the OS when the engine core goes idle (glibc's malloc_trim), at most once a second.

A long prefill or a big grammar leaves megabytes of freed blocks inside glibc's arenas; without a trim the process
keeps them resident, so RSS after a burst looks like a leak and a quiet core holds memory it does not use."""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable

MIN_INTERVAL_S = 1.0


def _glibc_trim() -> Callable[[], object] | None:
    """malloc_trim(0) where the C library has it (glibc), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class IdleTrimmer:
    """`idle()` trims when the core has just gone idle and the last trim is MIN_INTERVAL_S old."""

    def __init__(self, trim: Callable[[], object] | None = None, clock: Callable[[], float] = time.monotonic,
                 min_interval_s: float = MIN_INTERVAL_S) -> None:
        self._trim = trim if trim is not None else _glibc_trim()
        self._clock = clock
        self._min_interval_s = min_interval_s
        self._last = float("-inf")
        self.trims = 0

    def idle(self) -> None:
        now = self._clock()
        if self._trim is None or now - self._last < self._min_interval_s:
            return
        self._last = now
        self._trim()
        self.trims += 1
