"""Drive AsyncEngine for one HTTP request: errors before any byte is sent, abort on client disconnect."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Send

from mm_infer.engine.outputs import RequestOutput
from mm_infer.engine.sampling import SamplingParams
from servers.openai.errors import ApiError, from_exception
from servers.openai.pause import Ticket
from servers.openai.state import ServerState

Disconnected = Callable[[], Awaitable[bool]]


class ClientGone(Exception):
    """The client went away; its request was aborted and its KV blocks freed."""


def output_version(state: ServerState, out: RequestOutput | None) -> int:
    """The weight version that produced `out` (a replica stamps it), else the engine's current one."""
    stamped = out.extra.get("weight_version") if out is not None else None
    return state.weight_version if stamped is None else int(stamped)


def aborted_error() -> ApiError:
    return ApiError(503, "the request was aborted before it finished", type="aborted")


def check_not_aborted(out: RequestOutput, ticket: Ticket | None = None) -> RequestOutput:
    """An aborted generation (by a client, or by a pause in mode "abort") is never answered as a completion."""
    if any(c.finish_reason == "abort" for c in out.outputs) or (ticket is not None and ticket.aborted):
        raise aborted_error()
    return out


class Generation:
    """One engine request: `start()` surfaces prompt/media errors, then `final()` or `stream()`."""

    def __init__(self, state: ServerState, prompt: dict[str, Any], params: SamplingParams, request_id: str,
                 affinity_key: str | None = None, stream: bool = True) -> None:
        self.state = state
        self.request_id = request_id
        self.started = time.perf_counter()
        self._gen = state.engine.generate(prompt, params, request_id, affinity_key, stream)
        self.first: RequestOutput | None = None
        self.ticket: Ticket | None = None
        self.weight_version: int | None = None  # the version when it left the engine (set on close)
        self._closed = False

    def _leave(self, last: RequestOutput | None = None) -> None:
        self.weight_version = output_version(self.state, last)  # before leaving: a refit may wait for this moment
        if self.ticket is not None:
            self.state.gate.leave(self.ticket)

    async def start(self) -> RequestOutput:
        """Wait while the server is paused, then prepare, queue and wait for the first snapshot; bad prompts
        raise ApiError here."""
        self.ticket = await self.state.gate.admit(self.request_id)
        self.state.metrics.running += 1
        try:
            self.first = await self._gen.__anext__()
        except BaseException as exc:
            self.state.metrics.running -= 1
            self._closed = True
            self._leave()
            await self._gen.aclose()
            if isinstance(exc, asyncio.CancelledError):  # the client left before the first (or only) output
                self.state.metrics.aborted += 1
            if isinstance(exc, (asyncio.CancelledError, StopAsyncIteration)):
                raise
            raise from_exception(exc) from exc
        ttft = time.perf_counter() - self.started
        m = self.first.metrics
        if self.first.finished and m is not None and m.first_token_time and m.finished_time:
            ttft -= m.finished_time - m.first_token_time  # a final-only request: its first token came earlier
        self.state.metrics.first_token(max(ttft, 0.0))
        return self.first

    def _unless_paused_away(self, out: RequestOutput) -> RequestOutput:
        if self.ticket is not None and self.ticket.aborted:
            raise aborted_error()
        return out

    async def stream(self) -> AsyncIterator[RequestOutput]:
        """Snapshots from the first on; closing this iterator (client gone) aborts the request."""
        assert self.first is not None, "call start() first"
        last = self.first
        try:
            yield self._unless_paused_away(last)
            if not last.finished:
                async for out in self._gen:
                    last = out
                    yield self._unless_paused_away(out)
        finally:
            await self.aclose(last)

    async def aclose(self, last: RequestOutput | None = None) -> None:
        """Abort the engine request if it is still running (idempotent) and record its metrics."""
        if self._closed:
            return
        self._closed = True
        last = last or self.first
        self._leave(last)
        await self._gen.aclose()
        if last is None:
            return
        self.state.metrics.running -= 1
        if not last.finished or any(c.finish_reason == "abort" for c in last.outputs):
            self.state.metrics.aborted += 1
        self.state.metrics.tokens(len(last.prompt_token_ids), sum(len(c.token_ids) for c in last.outputs))

    async def final(self, disconnected: Disconnected | None = None) -> RequestOutput:
        """The finished output (starting the request if needed); aborts it when the client is gone."""
        async def run() -> RequestOutput:
            last = self.first or await self.start()
            async for out in self.stream():
                last = out
            return last

        return check_not_aborted(await watch(run(), disconnected), self.ticket)


async def watch(coro: Awaitable[RequestOutput], disconnected: Disconnected | None,
                poll_s: float = 0.2) -> RequestOutput:
    """Await coro while polling `disconnected`; a vanished client cancels it (which aborts the engine request)."""
    task = asyncio.ensure_future(coro)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=poll_s)
            if not task.done() and disconnected is not None and await disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise ClientGone()
        return task.result()
    finally:
        if not task.done():
            task.cancel()


async def merge_streams(gens: list[Generation]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(index, snapshot) from several started generations as they arrive; closing it closes them all."""
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, gen: Generation) -> None:
        try:
            async for out in gen.stream():
                await queue.put((i, out))
            await queue.put((i, None))
        except Exception as exc:
            await queue.put((i, exc))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(tasks)
        while left:
            i, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                left -= 1
                continue
            yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(g.aclose() for g in gens), return_exceptions=True)


class ClosingStreamingResponse(StreamingResponse):
    """SSE response that always closes its body iterator, so a vanished client aborts its request at once."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[union-attr]
