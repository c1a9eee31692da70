"""The FastAPI app: routes that validate with pydantic, call the engine, and answer with pydantic models."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import mm_infer
from servers.openai.admin import add_admin_routes
from servers.openai.chat import create_chat_completion
from servers.openai.completions import create_completion
from servers.openai.middleware import ServerMiddleware, log_error
from servers.openai.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from servers.openai.replies import (
    ApiError,
    ModelCard,
    ModelList,
    error_response,
    validation_error,
)
from servers.openai.responses_api.endpoint import create_response
from servers.openai.responses_api.protocol import ResponsesRequest
from servers.openai.state import ServerState
from servers.openai.streaming import ClientGone
from servers.openai.tokens import detokenize, tokenize

CLIENT_CLOSED = 499  # nginx's code for "client closed request": nobody reads it, metrics do


def _install_error_handlers(app: FastAPI) -> None:
    """ApiError and validation errors answer here; anything else (MediaError / PromptError with their own 4xx,
    real faults) is answered by ServerMiddleware, which sees the status it gets."""
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        log_error(request.method, request.url.path, exc)
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = validation_error(list(exc.errors()))
        log_error(request.method, request.url.path, err)
        return error_response(err.status, err.message, err.param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(ClientGone)
    async def gone(_: Request, exc: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED)


def _add_info_routes(app: FastAPI, state: ServerState) -> None:
    """Models, tokenize / detokenize, health, version and metrics."""
    @app.get("/v1/models")
    async def models() -> ModelList:
        names = dict.fromkeys((state.config.model_name, *state.config.extra_served_names))  # every served name
        return ModelList(data=[ModelCard(id=name, created=state.created, root=state.config.model_dir,
                                         max_model_len=state.backend.max_model_len,
                                         weight_version=state.backend.weight_version) for name in names])

    @app.post("/tokenize")
    async def tokenize_route(req: TokenizeRequest):
        return await tokenize(state, req)

    @app.post("/detokenize")
    async def detokenize_route(req: DetokenizeRequest):
        return detokenize(state, req)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if state.backend.is_alive else 503)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:  # vLLM's (SageMaker's) health check, open like /health
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
    cfg = state.config
    app.add_middleware(ServerMiddleware, api_key=cfg.api_key, max_body_bytes=cfg.max_body_bytes,
                       metrics=state.metrics, known_paths=frozenset(getattr(r, "path", "") for r in app.routes),
                       metrics_public=cfg.metrics_public, body_timeout_s=cfg.body_timeout_s,
                       closing=lambda: state.gate.closed_reason)
    return app
