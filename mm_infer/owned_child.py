"""Children whose lifetime the server owns (engine core, template workers) ignore the process group's stop signals."""

from __future__ import annotations

import signal


def ignore_group_signals() -> None:
    """Ctrl-C and `kill -- -PGID` signal the whole process group. The server drains in-flight requests first and then
    stops its children itself (a stop message, its pipe closing, or SIGKILL), so a child must outlive that signal:
    one that died of it would lose every request in flight, and the server would restart it while shutting down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
