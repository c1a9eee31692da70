"""latest_only: forward the newest item of an async stream at most once per interval (snapshots are cumulative)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")


async def latest_only(source: AsyncIterator[T], min_interval_s: float) -> AsyncIterator[T]:
    """Yield source's newest item, skipping ones overtaken within `min_interval_s`; the last item is always
    yielded and source errors are re-raised. Closing this iterator cancels the source (which aborts it)."""
    latest: list[T] = []  # at most one pending item
    ready = asyncio.Event()
    done = False
    error: BaseException | None = None

    async def pump() -> None:
        nonlocal done, error
        try:
            async for item in source:
                latest[:] = [item]
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
            if latest:
                item = latest.pop()
                yield item
            if done and not latest:
                if error is not None:
                    raise error
                return
            if not done and min_interval_s > 0:
                await asyncio.sleep(min_interval_s)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

