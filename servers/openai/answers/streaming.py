"""One engine request per HTTP request (errors before any byte, abort on disconnect) and the shared SSE helpers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Send

from mm_infer.engine.outputs.request_output import OutputAccumulator, RequestOutput
from mm_infer.engine.sampling.params import RequestOutputKind, SamplingParams
from mm_infer.prompt.inputs import PromptInput
from mm_infer.prompt.request import VLMRequest
from servers.openai.answers.logprobs import json_logprobs, usage
from servers.openai.bodies.errors import ApiError, error_body, from_exception
from servers.openai.bodies.replies import Usage
from servers.openai.bodies.structured import grammar_after_reasoning
from servers.openai.control.pause import Ticket
from servers.openai.state import ServerState
from servers.openai.web.json_encoding import sse  # noqa: F401  (re-exported: the endpoints' SSE encoder)
from servers.openai.web.middleware import log_error

Disconnected = Callable[[], Awaitable[bool]]


class ClientGone(Exception):
    """The client went away; its request was aborted and its KV blocks freed."""


def output_version(state: ServerState, out: RequestOutput | None) -> int:
    """The weight version that produced `out` (a replica stamps it), else the engine's current one."""
    stamped = out.extra.get("weight_version") if out is not None else None
    return state.backend.weight_version if stamped is None else int(stamped)


def partial_output(out: RequestOutput | None) -> dict[str, Any] | None:
    """What an aborted request produced before it ended, for its error body: ids and logprobs per sample."""
    if out is None:
        return None
    return {"partial": {"request_id": out.request_id, "prompt_token_ids": list(out.prompt_token_ids),
                        "choices": [{"index": c.index, "token_ids": list(c.token_ids),
                                     "logprobs": json_logprobs(c.logprobs), "text": c.text,
                                     "finish_reason": "abort"} for c in out.outputs]}}


def aborted_error(reason: str | None = None, out: RequestOutput | None = None) -> ApiError:
    return ApiError(503, reason or "the request was aborted before it finished", type="aborted",
                    extra=partial_output(out))


def check_not_aborted(out: RequestOutput, ticket: Ticket | None = None) -> RequestOutput:
    """An aborted generation (by a client, a pause in mode "abort", /abort_requests or a shutdown) is never
    answered as a completion; its error carries the partial output."""
    if ticket is not None and ticket.aborted:
        raise aborted_error(ticket.reason, out)
    if any(c.finish_reason == "abort" for c in out.outputs):
        raise aborted_error(None, out)
    return out


class Generation:
    """One engine request: `start()` surfaces prompt/media errors, then `final()` (the whole output) or `stream()`
    (DELTA outputs: only what is new each time; `whole()` assembles everything streamed so far)."""

    def __init__(self, state: ServerState, prompt: PromptInput | VLMRequest, params: SamplingParams, request_id: str,
                 affinity_key: str | None = None, stream: bool = True) -> None:
        self.state = state
        self.request_id = request_id
        self.started = time.perf_counter()
        if stream:
            params = replace(params, output_kind=RequestOutputKind.DELTA)
        params = grammar_after_reasoning(params, state.parser, state.preparer.tokenizer)  # vLLM: after </think>
        self._gen = state.backend.generate(prompt, params, request_id, affinity_key, stream)
        self._streamed = OutputAccumulator()
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
            self.first = self._streamed.add(await self._gen.__anext__())
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
            raise aborted_error(self.ticket.reason, self.whole())
        return out

    async def stream(self) -> AsyncIterator[RequestOutput]:
        """Outputs from the first on; closing this iterator (client gone) aborts the request."""
        assert self.first is not None, "call start() first"
        last = self.first
        try:
            yield self._unless_paused_away(last)
            if not last.finished:
                async for out in self._gen:
                    last = self._streamed.add(out)
                    yield self._unless_paused_away(out)
        finally:
            await self.aclose(last)

    def whole(self) -> RequestOutput | None:
        """Everything the request produced so far, assembled from its outputs (one join per sample)."""
        return self._streamed.whole()

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
        self.state.metrics.tokens(len(last.prompt_token_ids), self._streamed.num_generated())

    async def final(self, disconnected: Disconnected | None = None) -> RequestOutput:
        """The finished output (starting the request if needed); aborts it when the client is gone."""
        async def run() -> RequestOutput:
            if self.first is None:
                await self.start()
            async for _ in self.stream():
                pass
            whole = self.whole()
            assert whole is not None
            return whole

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
    # bounded: a reader that falls behind stops the pumps, so the engine's backpressure holds each generation
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue(maxsize=2 * len(gens))

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


def sse_error(status: int, message: str, type: str | None = None, extra: dict[str, Any] | None = None) -> str:
    """An error event in the middle of an SSE stream (the status line is long gone)."""
    return f"data: {json.dumps(error_body(status, message, type=type, extra=extra))}\n\n"


async def sse_events(outputs: AsyncIterator[tuple[int, RequestOutput]],
                     event: Callable[[int, RequestOutput], bytes | str | None],
                     close: Callable[[], Awaitable[None]],
                     tail: Callable[[], bytes | str | None]) -> AsyncIterator[bytes | str]:
    """The skeleton every streaming endpoint shares: an event per (index, output); an aborted output or an engine
    failure ends the stream with an error event, not a cut connection; then `tail()` (usage) if any, and [DONE]."""
    try:
        async for i, out in outputs:
            if any(c.finish_reason == "abort" for c in out.outputs):
                err = aborted_error()
                yield sse_error(err.status, err.message, type=err.type)
                break
            if (text := event(i, out)) is not None:
                yield text
    except Exception as exc:
        err = from_exception(exc)
        log_error("stream", "(after its first chunk)", err, exc)  # the status line went out long ago: log it here
        yield sse_error(err.status, err.message, type=err.type, extra=err.extra)
    finally:
        await close()
    if (text := tail()) is not None:
        yield text
    yield "data: [DONE]\n\n"


async def indexed(outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """One generation's outputs as (0, output), the shape sse_events takes."""
    async for out in outputs:
        yield 0, out


async def generation_events(gen: Generation, event: Callable[[int, RequestOutput], bytes | str | None],
                            usage_chunk: Callable[[Usage], bytes | str], stream_options: Any
                            ) -> AsyncIterator[bytes | str]:
    """sse_events over one Generation's stream (closing the stream and the generation), ending with the usage
    chunk when the request's stream_options ask for it and the generation finished."""
    stream = gen.stream()

    async def close() -> None:
        await stream.aclose()
        await gen.aclose()

    def tail() -> bytes | str | None:
        whole = gen.whole()
        if whole is None or not whole.finished or stream_options is None or not stream_options.include_usage:
            return None
        return usage_chunk(usage(whole))

    async for text in sse_events(indexed(stream), event, close, tail):
        yield text
