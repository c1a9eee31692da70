"""ApiError and the mapping of validation, prompt and media errors to OpenAI-style error bodies."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from servers.openai.responses import ErrorInfo, ErrorResponse

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 415: "unsupported_media_type",
          500: "internal_server_error", 503: "service_unavailable"}


class ApiError(Exception):
    """An error answered to the client with `status` and an OpenAI error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type or _TYPES.get(status, "invalid_request_error")


def error_body(status: int, message: str, param: str | None = None, type: str | None = None) -> dict[str, Any]:
    info = ErrorInfo(message=message, type=type or _TYPES.get(status, "invalid_request_error"), param=param,
                     code=status)
    return ErrorResponse(error=info).model_dump()


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)


def from_exception(exc: BaseException) -> ApiError:
    """ApiError for anything a request can raise: MediaError / PromptError keep their .status (400/413/415)."""
    if isinstance(exc, ApiError):
        return exc
    status = getattr(exc, "status", None)
    if isinstance(status, int) and (400 <= status < 500 or status == 503):  # 503: no replica / replica died
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
    return ApiError(400, f"invalid request: {detail}", param=loc or None)
