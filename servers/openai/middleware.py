"""ASGI middleware: API-key check (401), request body cap (413), and per-endpoint request metrics."""

from __future__ import annotations

import hmac
import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servers.openai.errors import error_body
from servers.openai.metrics import Metrics

OPEN_PATHS = ("/health", "/version", "/metrics", "/ping")


async def _send_error(send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class ServerMiddleware:
    """Runs before routing: auth, then the body cap (buffered and replayed), then timing."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int, metrics: Metrics,
                 known_paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.known_paths = known_paths  # metric labels: anything else counts as "other"
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    def _authorized(self, scope: Scope) -> bool:
        if self.api_key is None or scope["path"] in OPEN_PATHS:
            return True
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    async def _read_body(self, receive: Receive) -> list[Message] | None:
        """All body messages, or None once they pass the cap."""
        messages, total = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages
            total += len(message.get("body", b""))
            if total > self.max_body_bytes:
                return None
            if not message.get("more_body", False):
                return messages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in self.known_paths else "other"
        if not self._authorized(scope):
            self.metrics.request_done(path, 401)
            await _send_error(send, 401, "missing or invalid API key (send Authorization: Bearer <key>)",
                              [(b"www-authenticate", b"Bearer")])
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_big = declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes
        buffered = None if too_big else await self._read_body(receive)
        if buffered is None:
            self.metrics.request_done(path, 413)
            await _send_error(send, 413, f"request body is over the limit of {self.max_body_bytes} bytes")
            return

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        status = [500]
        started = time.perf_counter()

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, replay, send_status)
        finally:
            self.metrics.request_done(path, status[0], time.perf_counter() - started)
