"""Pause / resume for weight refits: an admission gate and in-flight request tickets over a freezable engine."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from mm_infer.engine.control.ops import Freeze
from mm_infer.engine_core.heap_trim import IdleTrimmer
from mm_infer.serving import EngineBackend
from servers.openai.bodies.errors import ApiError

PauseMode = Literal["abort", "wait", "keep"]


@dataclass
class Ticket:
    """One admitted engine request; `aborted` once a pause in mode "abort" ended it."""

    request_id: str
    aborted: bool = False
    reason: str | None = None  # why it was aborted, for its error body (None: the generic message)


class PauseGate:
    """New requests pass `admit()` only while running; a pause holds them there (in every mode) until resume()."""

    def __init__(self, engine: EngineBackend, abort_poll_s: float = 0.02) -> None:
        self.engine = engine
        self.mode: PauseMode | None = None
        self.abort_poll_s = abort_poll_s
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._inflight: dict[str, Ticket] = {}
        self.closed_reason: str | None = None  # set by close(): no request is admitted again
        self.refusing: str | None = None  # set by refuse(): requests get a 503 with it at once (a sleeping engine)
        self._pending: dict[str, str | None] = {}  # requests named but not admitted yet -> why they were aborted
        # the server keeps up to 256 MiB of freed heap for its next burst (host_allocator.py): when the last request
        # leaves, hand it back (at most once a second), so an idle server's RSS falls back as the engine core's does
        self._trimmer = IdleTrimmer()

    @property
    def paused(self) -> bool:
        return self.mode is not None

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    async def admit(self, request_id: str) -> Ticket:
        """Wait while paused, then register the request as in flight (no await between check and register).
        Request ids are unique among requests in flight: a second one is a 400 (it would hide the first's ticket)."""
        while not self._open.is_set() and self.closed_reason is None and self.refusing is None:
            await self._open.wait()
        if self.closed_reason is not None or self.refusing is not None:
            raise ApiError(503, self.closed_reason or self.refusing or "")
        if request_id in self._inflight:
            raise ApiError(400, f"request_id {request_id!r} is already in use by a request in flight",
                           param="request_id")
        head, _, tail = request_id.rpartition("-")
        if reason := self._pending.get(request_id) or (self._pending.get(head) if tail.isdigit() else None):
            raise ApiError(503, reason, type="aborted")  # aborted by id while it was still preparing
        ticket = Ticket(request_id)
        self._inflight[request_id] = ticket
        self._idle.clear()
        return ticket

    def leave(self, ticket: Ticket) -> None:
        self._inflight.pop(ticket.request_id, None)
        if not self._inflight:
            self._idle.set()
            self._trimmer.idle()

    async def pause(self, mode: PauseMode) -> int:
        """Stop admitting; then abort, await or freeze the in-flight requests. Returns how many there were."""
        self.mode = mode
        self._open.clear()
        count = len(self._inflight)
        await self.engine.control(Freeze(mode == "keep"))
        if mode == "abort":
            await self._abort_inflight(None)
        elif mode == "wait":
            await self._idle.wait()
        return count

    async def _abort_inflight(self, reason: str | None) -> None:
        """Abort every request in flight and wait until each has left."""
        while self._inflight:  # a request still preparing its prompt is aborted once it reaches the engine
            for ticket in list(self._inflight.values()):
                ticket.aborted, ticket.reason = True, ticket.reason or reason
                self.engine.abort(ticket.request_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self.abort_poll_s)

    async def close(self, timeout_s: float, reason: str) -> int:
        """Shutdown: admit nothing more (503 with `reason`), give the requests in flight up to timeout_s to finish,
        then abort the rest (their error bodies and events carry `reason`). Returns how many were aborted."""
        self.closed_reason = reason
        self._open.set()  # requests held by a pause get their 503 now
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        left = len(self._inflight)
        await self.engine.control(Freeze(False))
        await self._abort_inflight(reason)
        return left

    @contextlib.contextmanager
    def reserved(self, request_id: str) -> Iterator[None]:
        """Name a request from its route's start, before admit(): an abort by id that arrives while it still
        prepares (media, template) makes admit() answer 503."""
        self._pending.setdefault(request_id, None)
        try:
            yield
        finally:
            self._pending.pop(request_id, None)

    def abort_matching(self, matches: Callable[[str], bool], reason: str) -> list[str]:
        """Abort the requests whose id `matches`, in flight or still preparing (their errors carry `reason`);
        their ids."""
        hit = [t for t in self._inflight.values() if matches(t.request_id)]
        for ticket in hit:
            ticket.aborted, ticket.reason = True, ticket.reason or reason
            self.engine.abort(ticket.request_id)
        pending = [rid for rid in self._pending if matches(rid)]
        for rid in pending:
            self._pending[rid] = self._pending[rid] or reason
        ids = [t.request_id for t in hit]
        return ids + [rid for rid in pending if not any(i == rid or i.startswith(f"{rid}-") for i in ids)]

    def refuse(self, reason: str | None) -> None:
        """With a reason, admit() answers 503 with it (requests held by a pause too); None: back to the pause
        state as it is (held while paused, admitted otherwise)."""
        self.refusing = reason
        if reason is not None:
            self._open.set()
        elif self.mode is not None:
            self._open.clear()

    async def resume(self) -> None:
        await self.engine.control(Freeze(False))
        self.mode = None
        self._open.set()
