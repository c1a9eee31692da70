"""OpenAI error bodies with vLLM's error types, ApiError, and the mapping of any exception to one."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# vLLM 0.32's error types (serve/exception_handling/error_response.py) where it has them, OpenAI-style elsewhere
_TYPES = {400: "BadRequestError", 401: "authentication_error", 403: "permission_error",
          404: "NotFoundError", 413: "request_too_large", 415: "unsupported_media_type",
          500: "InternalServerError", 503: "ServiceUnavailableError"}


class ApiError(Exception):
    """An error answered to the client with `status` and an OpenAI error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, type: str | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type or _TYPES.get(status, "BadRequestError")
        self.extra = extra  # top-level keys beside "error" (an aborted request's partial output)


def error_body(status: int, message: str, param: str | None = None, type: str | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    info = ErrorInfo(message=message, type=type or _TYPES.get(status, "BadRequestError"), param=param,
                     code=status)
    return {**ErrorResponse(error=info).model_dump(), **(extra or {})}


def error_response(status: int, message: str, param: str | None = None, type: str | None = None,
                   extra: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, type, extra), status_code=status, headers=headers)


def from_exception(exc: BaseException) -> ApiError:
    """ApiError for anything a request can raise. An error with a .status (MediaError / PromptError 400/413/415, an
    engine's RequestFailedError 400/500, asleep or no replica 503) keeps it and its text, which is written for the
    client, whichever backend (thread, core process, replica) raised it; anything else is a 500 naming its type."""
    if isinstance(exc, ApiError):
        return exc
    status = getattr(exc, "status", None)
    if isinstance(status, int) and 400 <= status < 600:
        return ApiError(status, str(exc), param=getattr(exc, "param", None))
    if isinstance(exc, ValueError):
        return ApiError(400, str(exc))
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}")


def validation_error(errors: list[dict[str, Any]]) -> ApiError:
    """Pydantic errors -> one 400; unknown fields are named as unrecognized request arguments."""
    unknown = [".".join(str(p) for p in e["loc"] if p != "body") for e in errors if e.get("type") == "extra_forbidden"]
    if unknown:
        return ApiError(400, f"unrecognized request argument(s): {', '.join(unknown)}", param=unknown[0])
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    detail = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'request body'}: "
                       f"{e.get('msg')}" for e in errors[:5])
    kind = str(first.get("type", ""))
    if kind == "missing" or kind.endswith("_type"):  # a missing field or a wrong JSON type: vLLM leaves these to
        # FastAPI's validation, answered with type "Bad Request" and the location as "body.<field>"
        return ApiError(400, f"invalid request: {detail}", param=f"body.{loc}" if loc else None, type="Bad Request")
    return ApiError(400, f"invalid request: {detail}", param=loc or None)
