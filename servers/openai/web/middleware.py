"""ServerMiddleware: auth, the body cap and its read deadline, the media client scope, error bodies, metrics, logs."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servers.openai.bodies.errors import ApiError, error_body, from_exception
from servers.openai.media.request_media import media_client_scope
from servers.openai.web.metrics import Metrics

log = logging.getLogger("mm_infer.server")

ALWAYS_OPEN = frozenset({"/health", "/ping"})
INFO_PATHS = frozenset({"/metrics", "/version"})  # open too with --metrics-public


def log_error(method: str, path: str, err: ApiError, exc: BaseException | None = None) -> None:
    """A client's error is one WARNING line; a server error is an ERROR with its traceback."""
    if err.status < 500:
        log.warning("%s %s -> %d: %s", method, path, err.status, err.message)
    elif err.status == 503:  # busy, asleep, paused or a replica down: a state, not a bug, so no traceback
        log.error("%s %s -> %d: %s", method, path, err.status, err.message)
    else:
        log.error("%s %s -> %d: %s", method, path, err.status, err.message, exc_info=exc)


async def send_error(send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] = (),
                     param: str | None = None) -> None:
    body = json.dumps(error_body(status, message, param)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def _client_scope(scope: Scope, token: str | None) -> str:
    """Who a request is, for the media uuid cache: its API key when the server has one, else its address."""
    if token is not None:
        return "key:" + hashlib.sha256(token.encode()).hexdigest()[:32]
    client = scope.get("client")
    return f"addr:{client[0]}" if client else "addr:?"


class ServerMiddleware:
    """Runs before routing: auth, then the body cap and read deadline (buffered and replayed), then timing; any
    exception the app lets out becomes an error body with its real status, counted and logged once."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int, metrics: Metrics,
                 known_paths: frozenset[str] = frozenset(), metrics_public: bool = False,
                 body_timeout_s: float = 30.0, closing: Callable[[], str | None] = lambda: None) -> None:
        self.app = app
        self.known_paths = known_paths  # metric labels: anything else counts as "other"
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.open_paths = ALWAYS_OPEN | (INFO_PATHS if metrics_public else frozenset())
        self.body_timeout_s = body_timeout_s
        self.closing = closing  # the reason new requests are refused with a 503 (shutting down), or None

    def _token(self, scope: Scope) -> str | None:
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None

    def _authorized(self, scope: Scope, token: str | None) -> bool:
        if self.api_key is None or scope["path"] in self.open_paths:
            return True
        return token is not None and hmac.compare_digest(token.encode(), self.api_key.encode())

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

    async def _refuse(self, send: Send, path: str, status: int, message: str,
                      headers: list[tuple[bytes, bytes]] = ()) -> None:
        self.metrics.request_done(path, status)
        log.warning("%s -> %d: %s", path, status, message)
        await send_error(send, status, message, headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in self.known_paths else "other"
        if (reason := self.closing()) is not None:
            await self._refuse(send, path, 503, reason, [(b"connection", b"close")])
            return
        token = self._token(scope)
        if not self._authorized(scope, token):
            await self._refuse(send, path, 401, "missing or invalid API key (send Authorization: Bearer <key>)",
                               [(b"www-authenticate", b"Bearer")])
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(send, path, 413, f"request body is over the limit of {self.max_body_bytes} bytes")
            return
        try:
            buffered = await asyncio.wait_for(self._read_body(receive), self.body_timeout_s)
        except TimeoutError:
            await self._refuse(send, path, 408, f"the request body did not arrive within {self.body_timeout_s}s")
            return
        if buffered is None:
            await self._refuse(send, path, 413, f"request body is over the limit of {self.max_body_bytes} bytes")
            return
        media_client_scope.set(_client_scope(scope, token if self.api_key is not None else None))
        await self._run(scope, buffered, receive, send, path)

    async def _run(self, scope: Scope, buffered: list[Message], receive: Receive, send: Send, path: str) -> None:
        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        status: list[int | None] = [None]
        started = time.perf_counter()

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, replay, send_status)
        except Exception as exc:  # past the routes' own handlers: answer it here, with its real status
            err = from_exception(exc)
            log_error(scope.get("method", ""), scope["path"], err, exc)
            if status[0] is None:
                status[0] = err.status
                await send_error(send, err.status, err.message, param=err.param)
        finally:
            self.metrics.request_done(path, status[0] or 500, time.perf_counter() - started)
