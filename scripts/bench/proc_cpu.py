"""CPU seconds used by a process session (a server started with start_new_session=True), read from /proc."""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(stat: str) -> list[str]:
    """The fields after the command name (which may hold spaces and parentheses)."""
    return stat[stat.rindex(")") + 2:].split()


def session_cpu_seconds(sid: int) -> float:
    """User + system CPU of every live process in session `sid`, with their waited-for children."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = _stat_fields(stat.read_text())
        except (OSError, ValueError):
            continue  # the process ended while we looked
        if int(f[3]) == sid:  # fields from state: state ppid pgrp session ...; utime is field 14 overall
            total += sum(int(x) for x in f[11:15])
    return total / TICKS


def session_of(*args: str) -> int | None:
    """The session of the first process whose argv holds every one of `args`, or None."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if all(a in argv for a in args):
            return os.getsid(int(cmdline.parent.name))
    return None


def main_thread_cpu_seconds(pid: int) -> float:
    """User + system CPU of the main thread of `pid` (a server's event loop), or nan when it is gone."""
    try:
        f = _stat_fields(Path(f"/proc/{pid}/task/{pid}/stat").read_text())
    except (OSError, ValueError):
        return float("nan")
    return sum(int(x) for x in f[11:13]) / TICKS
