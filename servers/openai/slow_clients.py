"""uvicorn's h11 protocol with a deadline on request headers: a slowloris client dripping header lines is cut off."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderDeadlineProtocol(H11Protocol):
    """The headers of each request must be complete within `header_timeout_s` of the connection opening (or of the
    previous response); uvicorn's own keep-alive timer restarts on every byte, so a drip would beat it."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
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

    def handle_events(self) -> None:
        super().handle_events()
        if not self._waiting_for_headers():  # a request's headers are in: the app owns the connection now
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._waiting_for_headers():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def header_deadline_protocol(timeout_s: float) -> type[HeaderDeadlineProtocol]:
    """A protocol class with its own header deadline (uvicorn takes a class, not an instance)."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": timeout_s})
