"""The FastAPI app: routes that validate with pydantic, call the engine, and answer with pydantic models."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import mm_infer
from servers.openai.errors import ApiError, error_response, from_exception, validation_error
from servers.openai.generation import ClientGone
from servers.openai.middleware import ServerMiddleware
from servers.openai.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from servers.openai.responses import ModelCard, ModelList
from servers.openai.responses_protocol import ResponsesRequest
from servers.openai.serving_admin import add_admin_routes
from servers.openai.serving_chat import create_chat_completion
from servers.openai.serving_completion import create_completion
from servers.openai.serving_responses import create_response
from servers.openai.serving_tokens import detokenize, tokenize
from servers.openai.state import ServerState

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

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=state.config.model_name, created=state.created,
                                         root=state.config.model_dir, max_model_len=state.max_model_len,
                                         weight_version=state.weight_version)])

    @app.post("/tokenize")
    async def tokenize_route(req: TokenizeRequest):
        return await tokenize(state, req)

    @app.post("/detokenize")
    async def detokenize_route(req: DetokenizeRequest):
        return detokenize(state, req)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if state.engine_alive else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": mm_infer.__version__}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(state.gauges()), media_type="text/plain; version=0.0.4")

    add_admin_routes(app, state)
    app.add_middleware(ServerMiddleware, api_key=state.config.api_key, max_body_bytes=state.config.max_body_bytes,
                       metrics=state.metrics, known_paths=frozenset(getattr(r, "path", "") for r in app.routes))
    return app
