"""uvicorn's HTTP protocols (httptools, else h11) with a deadline on request headers: a slowloris drip is cut off."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderDeadline:
    """The headers of each request must be complete within `header_timeout_s` of the connection opening (or of the
    previous response); uvicorn's own keep-alive timer restarts on every byte, so a drip would beat it. A mixin
    over a uvicorn protocol: it uses the protocol's `loop`, `transport` and `cycle`."""

    header_timeout_s = 10.0
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()

    def _waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        if self._waiting_for_headers() and not self.transport.is_closing():
            self.transport.close()

    def _headers_seen(self) -> None:
        if not self._waiting_for_headers():  # a request's headers are in: the app owns the connection now
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing() and self._waiting_for_headers():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]


class HeaderDeadlineProtocol(HeaderDeadline, H11Protocol):
    """h11 (pure Python): the fallback where httptools is not installed."""

    def handle_events(self) -> None:
        super().handle_events()
        self._headers_seen()


def _httptools_protocol() -> type[HeaderDeadline] | None:
    """The httptools-based protocol with the deadline, or None when httptools is not importable."""
    if importlib.util.find_spec("httptools") is None:
        return None
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HttpToolsDeadlineProtocol(HeaderDeadline, HttpToolsProtocol):
        """httptools (llhttp in C): uvicorn's fast parser."""

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._headers_seen()

    return HttpToolsDeadlineProtocol


HttpToolsDeadlineProtocol = _httptools_protocol()


def header_deadline_protocol(timeout_s: float, fast: bool = True) -> type[HeaderDeadline]:
    """A protocol class with its own header deadline (uvicorn takes a class, not an instance): httptools when
    `fast` and importable, else h11."""
    base: type[HeaderDeadline] = HttpToolsDeadlineProtocol if fast and HttpToolsDeadlineProtocol else \
        HeaderDeadlineProtocol
    return type(base.__name__, (base,), {"header_timeout_s": timeout_s})


def event_loop() -> str:
    """uvicorn's `loop` setting: uvloop when importable, else asyncio's own."""
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
