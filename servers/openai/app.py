"""The FastAPI app: routes that validate with pydantic, call the engine, and answer with pydantic models."""

from __future__ import annotations

import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import mm_infer
from servers.openai.admin import add_admin_routes
from servers.openai.chat import create_chat_completion
from servers.openai.completions import create_completion
from servers.openai.metrics import Metrics
from servers.openai.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from servers.openai.replies import (
    ApiError,
    ModelCard,
    ModelList,
    error_body,
    error_response,
    from_exception,
    validation_error,
)
from servers.openai.responses_api.endpoint import create_response
from servers.openai.responses_api.protocol import ResponsesRequest
from servers.openai.state import ServerState
from servers.openai.streaming import ClientGone
from servers.openai.tokens import detokenize, tokenize

CLIENT_CLOSED = 499  # nginx's code for "client closed request": nobody reads it, metrics do


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = validation_error(list(exc.errors()))
        return error_response(err.status, err.message, err.param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(ClientGone)
    async def gone(_: Request, exc: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(Exception)
    async def other(_: Request, exc: Exception) -> JSONResponse:
        err = from_exception(exc)  # MediaError / PromptError carry their own 4xx status
        return error_response(err.status, err.message, err.param)


def _add_info_routes(app: FastAPI, state: ServerState) -> None:
    """Models, tokenize / detokenize, health, version and metrics."""
    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=state.config.model_name, created=state.created,
                                         root=state.config.model_dir, max_model_len=state.backend.max_model_len,
                                         weight_version=state.backend.weight_version)])

    @app.post("/tokenize")
    async def tokenize_route(req: TokenizeRequest):
        return await tokenize(state, req)

    @app.post("/detokenize")
    async def detokenize_route(req: DetokenizeRequest):
        return detokenize(state, req)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if state.backend.is_alive else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": mm_infer.__version__}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(state.gauges()), media_type="text/plain; version=0.0.4")


def build_app(state: ServerState) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await state.aclose()

    app = FastAPI(title="mm-infer", version=mm_infer.__version__, lifespan=lifespan)
    app.state.server = state
    _install_error_handlers(app)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        return await create_chat_completion(state, req, request)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        return await create_completion(state, req, request)

    @app.post("/v1/responses")
    async def responses(req: ResponsesRequest, request: Request):
        return await create_response(state, req, request)

    _add_info_routes(app, state)
    add_admin_routes(app, state)
    app.add_middleware(ServerMiddleware, api_key=state.config.api_key, max_body_bytes=state.config.max_body_bytes,
                       metrics=state.metrics, known_paths=frozenset(getattr(r, "path", "") for r in app.routes))
    return app


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
