"""One request's outputs on their way from the engine thread to an asyncio reader, with backpressure."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from mm_infer.engine.sequence import SequenceGroup


@dataclass(frozen=True)
class Backpressure:
    """A reader `high` outputs behind holds its request (not scheduled; its KV kept) until it is `low` behind;
    held for `stall_timeout_s`, the request is aborted and its KV freed."""

    high: int = 256
    low: int = 64
    stall_timeout_s: float = 120.0


@dataclass
class OutputStream:
    """The queue one reader drains. `sent` is written by the engine thread only and `taken` by the reader only,
    so `sent - taken` (outputs not yet read) needs no lock."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    sent: int = 0
    taken: int = 0
    held_since: float | None = None

    @property
    def behind(self) -> int:
        return self.sent - self.taken

    def put(self, item: Any, group: SequenceGroup | None, policy: Backpressure) -> None:
        """Engine thread: queue an output; hold the request when its reader is too far behind."""
        self.sent += 1
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        if group is not None and not group.held and self.behind >= policy.high:
            group.held = True
            self.held_since = time.monotonic()

    def took(self, group: SequenceGroup | None, policy: Backpressure) -> bool:
        """Reader: one output read. True when this released the request's hold (wake the engine loop)."""
        self.taken += 1
        if group is not None and group.held and self.behind <= policy.low:
            group.held = False
            self.held_since = None
            return True
        return False

    def stalled(self, now: float, policy: Backpressure) -> bool:
        return self.held_since is not None and now - self.held_since > policy.stall_timeout_s
