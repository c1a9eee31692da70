"""One request's outputs on their way from the engine thread to an asyncio reader, with backpressure."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from mm_infer.engine.outputs.request_output import RequestOutput, merge_delta
from mm_infer.engine.sampling.params import RequestOutputKind


class Holdable(Protocol):
    """What a stream can hold back: a SequenceGroup, or the core process's stand-in for one."""

    held: bool


@dataclass(frozen=True)
class Backpressure:
    """A reader `high` outputs behind holds its request (not scheduled; its KV kept) until it is `low` behind;
    held for `stall_timeout_s`, the request is aborted and its KV freed."""

    high: int = 256
    low: int = 64
    stall_timeout_s: float = 120.0


@dataclass
class OutputStream:
    """The outputs one reader drains. `sent` is written by the engine thread only and `taken` by the reader only,
    so `sent - taken` (outputs not yet read) needs no lock. A reader that fell behind a DELTA stream gets what
    waits merged into one output (as vLLM's output collector does): fewer, larger chunks under load, the same
    tokens."""

    loop: asyncio.AbstractEventLoop
    kind: RequestOutputKind = RequestOutputKind.CUMULATIVE  # DELTA: waiting outputs merge; CUMULATIVE: the newest
    items: deque[Any] = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    sent: int = 0
    taken: int = 0
    held_since: float | None = None

    @property
    def behind(self) -> int:
        return self.sent - self.taken

    def _push(self, item: Any) -> None:
        self.items.append(item)
        self.ready.set()

    def put(self, item: Any, group: Holdable | None, policy: Backpressure) -> None:
        """Engine thread: queue an output; hold the request when its reader is too far behind."""
        self.sent += 1
        self.loop.call_soon_threadsafe(self._push, item)
        if group is not None and not group.held and self.behind >= policy.high:
            group.held = True
            self.held_since = time.monotonic()

    async def get(self, group: Holdable | None, policy: Backpressure) -> tuple[Any, bool]:
        """Reader: the next output (DELTA outputs waiting behind it merged in; an error is never merged) and
        whether reading released the request's hold (wake the engine loop)."""
        while not self.items:
            self.ready.clear()
            await self.ready.wait()
        item = self.items.popleft()
        released = self.took(group, policy)
        while isinstance(item, RequestOutput) and self.items and isinstance(self.items[0], RequestOutput):
            newer = self.items.popleft()
            item = merge_delta(item, newer) if self.kind is RequestOutputKind.DELTA else newer
            released = self.took(group, policy) or released
        return item, released

    def took(self, group: Holdable | None, policy: Backpressure) -> bool:
        """Reader: one output read. True when this released the request's hold (wake the engine loop)."""
        self.taken += 1
        if group is not None and group.held and self.behind <= policy.low:
            group.held = False
            self.held_since = None
            return True
        return False

    def stalled(self, now: float, policy: Backpressure) -> bool:
        return self.held_since is not None and now - self.held_since > policy.stall_timeout_s
