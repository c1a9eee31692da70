"""coalesced: forward an async stream of deltas at most once per interval, joining the deltas that wait meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

T = TypeVar("T")


async def coalesced(source: AsyncIterator[T], min_interval_s: float, join: Callable[[T, T], T]) -> AsyncIterator[T]:
    """Yield source's items, those that arrive within `min_interval_s` of the last yield joined into one
    (`join(older, newer)`); nothing is dropped, the last item always goes out and source errors are re-raised after
    the items before them. Closing this iterator cancels the source (which aborts it)."""
    pending: list[T] = []  # at most one joined item
    ready = asyncio.Event()
    done = False
    error: BaseException | None = None

    async def pump() -> None:
        nonlocal done, error
        try:
            async for item in source:
                pending[:] = [join(pending[0], item)] if pending else [item]
                ready.set()
        except Exception as exc:
            error = exc
        finally:
            done = True
            ready.set()

    task = asyncio.ensure_future(pump())
    try:
        while True:
            await ready.wait()
            ready.clear()
            if pending:
                yield pending.pop()
            if done and not pending:
                if error is not None:
                    raise error
                return
            if not done and min_interval_s > 0:
                await asyncio.sleep(min_interval_s)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
