"""The FastAPI app: routes that validate with pydantic, call the engine, and answer with pydantic models."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import mm_infer
from servers.openai.answers.streaming import ClientGone
from servers.openai.bodies.errors import ApiError, error_response, validation_error
from servers.openai.bodies.generate import GenerateRequest
from servers.openai.bodies.replies import ModelCard, ModelList
from servers.openai.bodies.requests import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from servers.openai.endpoints.abort import add_abort_routes, base_request_id
from servers.openai.endpoints.admin import add_admin_routes
from servers.openai.endpoints.chat import create_chat_completion
from servers.openai.endpoints.completions import create_completion
from servers.openai.endpoints.generate import generate_tokens
from servers.openai.endpoints.render import render_chat, render_completion
from servers.openai.endpoints.responses_api.endpoint import create_response
from servers.openai.endpoints.responses_api.protocol import ResponsesRequest
from servers.openai.endpoints.tokens import detokenize, tokenize
from servers.openai.state import ServerState
from servers.openai.web.middleware import ServerMiddleware, log_error

CLIENT_CLOSED = 499  # nginx's code for "client closed request": nobody reads it, metrics do


def _install_error_handlers(app: FastAPI) -> None:
    """ApiError and validation errors answer here; anything else (MediaError / PromptError with their own 4xx,
    real faults) is answered by ServerMiddleware, which sees the status it gets."""
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        log_error(request.method, request.url.path, exc)
        rid = getattr(request.state, "request_id", None)
        return error_response(exc.status, exc.message, exc.param, exc.type, exc.extra,
                              {"X-Request-Id": rid} if rid else None)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = validation_error(list(exc.errors()))
        log_error(request.method, request.url.path, err)
        return error_response(err.status, err.message, err.param, err.type)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(ClientGone)
    async def gone(_: Request, exc: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED)


def served_names(state: ServerState) -> tuple[str, ...]:
    return tuple(dict.fromkeys((state.config.model_name, *state.config.extra_served_names)))


def check_model(state: ServerState, model: str | None) -> None:
    """vLLM's rule: a model name the server does not serve is a 404; none (missing or empty) means the first.
    Without --served-model-name vLLM serves the model argument as given (a path), so that name is accepted too."""
    unnamed_path = () if state.config.served_model_name else (state.config.model_dir,)
    if model and model not in (*served_names(state), *unnamed_path):
        raise ApiError(404, f"The model `{model}` does not exist.", param="model", type="NotFoundError")


def _add_info_routes(app: FastAPI, state: ServerState) -> None:
    """Models, tokenize / detokenize, health, version and metrics."""
    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=name, created=state.created, root=state.config.model_dir,
                                         max_model_len=state.backend.facts.max_model_len,
                                         weight_version=state.backend.weight_version) for name in served_names(state)])

    @app.post("/tokenize")
    async def tokenize_route(req: TokenizeRequest):
        check_model(state, req.model)
        return await tokenize(state, req)

    @app.post("/detokenize")
    async def detokenize_route(req: DetokenizeRequest):
        check_model(state, req.model)
        return detokenize(state, req)

    @app.api_route("/health", methods=["GET", "HEAD"])  # load balancers probe with HEAD too
    async def health() -> Response:
        return Response(status_code=200 if state.backend.is_alive else 503)

    @app.api_route("/ping", methods=["GET", "HEAD", "POST"])
    async def ping() -> Response:  # vLLM's (SageMaker's) health check, open like /health
        return Response(status_code=200 if state.backend.is_alive else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": mm_infer.__version__}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(state.gauges()), media_type="text/plain; version=0.0.4")


def name_request(request: Request, req: Any, prefix: str) -> str:
    """Fix the request's id up front (header, body, or fresh): its answer, error and /abort_requests use it."""
    req.request_id = base_request_id(request, req.request_id)
    request.state.request_id = f"{prefix}{req.request_id}"
    return request.state.request_id


def echo_id(result: Any, response: Response, rid: str) -> Any:
    """The request's id in the X-Request-Id header (a stream's own response, or the one FastAPI fills)."""
    (result if isinstance(result, Response) else response).headers["X-Request-Id"] = rid
    return result


def _add_generation_routes(app: FastAPI, state: ServerState) -> None:
    """Chat, completions, responses, render and token-in/token-out generate; each request's id is reserved (so
    /abort_requests finds it) and echoed in X-Request-Id."""
    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request, response: Response):
        check_model(state, req.model)
        rid = name_request(request, req, "chatcmpl-")
        with state.gate.reserved(rid):
            return echo_id(await create_chat_completion(state, req, request), response, rid)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request, response: Response):
        check_model(state, req.model)
        rid = name_request(request, req, "cmpl-")
        with state.gate.reserved(rid):
            return echo_id(await create_completion(state, req, request), response, rid)

    @app.post("/v1/chat/completions/render")
    async def chat_render(req: ChatCompletionRequest, request: Request):
        check_model(state, req.model)
        return await render_chat(state, req, base_request_id(request, req.request_id))

    @app.post("/v1/completions/render")
    async def completions_render(req: CompletionRequest, request: Request):
        check_model(state, req.model)
        return await render_completion(state, req, base_request_id(request, req.request_id))

    @app.post("/inference/v1/generate")
    async def generate(req: GenerateRequest, request: Request, response: Response):
        check_model(state, req.model)
        rid = name_request(request, req, "generate-tokens-")
        with state.gate.reserved(rid):
            return echo_id(await generate_tokens(state, req, request, req.request_id or ""), response, rid)

    @app.post("/v1/responses")
    async def responses(req: ResponsesRequest, request: Request, response: Response):
        check_model(state, req.model)
        rid = name_request(request, req, "resp_")
        with state.gate.reserved(rid):
            return echo_id(await create_response(state, req, request), response, rid)


def build_app(state: ServerState) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await state.aclose()

    app = FastAPI(title="mm-infer", version=mm_infer.__version__, lifespan=lifespan)
    app.state.server = state
    _install_error_handlers(app)
    _add_generation_routes(app, state)
    _add_info_routes(app, state)
    add_admin_routes(app, state)
    add_abort_routes(app, state)
    cfg = state.config
    app.add_middleware(ServerMiddleware, api_key=cfg.api_key, max_body_bytes=cfg.max_body_bytes,
                       metrics=state.metrics, known_paths=frozenset(getattr(r, "path", "") for r in app.routes),
                       metrics_public=cfg.metrics_public, body_timeout_s=cfg.body_timeout_s,
                       closing=lambda: state.gate.closed_reason)
    return app
