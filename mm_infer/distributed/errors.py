"""Errors of the replica layer; each carries the HTTP status the server answers with, and crosses processes."""

from __future__ import annotations

import pickle


class ReplicaUnavailableError(RuntimeError):
    """No replica can take the request, or the one serving it died: 503, never retried behind the caller's back."""

    status = 503


def describe_failure(exc: BaseException, limit: int = 240) -> str:
    """A one-line cause for an error message: the exception type and the first line of its text."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    first = first if len(first) <= limit else first[: limit - 3] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def portable_error(exc: BaseException) -> BaseException:
    """What a process sends in place of `exc` (the engine core's pipe, a replica's Ray call): exc itself if it
    survives a pickle round trip with its type, status and text; else a RuntimeError with its status and param and
    the same text (an error with a status is written for the client: its text is kept bare; one without is named
    by its type). Either way the server answers the same status and body as it would for exc itself."""
    try:
        back = pickle.loads(pickle.dumps(exc, protocol=5))
        if type(back) is type(exc) and str(back) == str(exc) and \
                getattr(back, "status", None) == getattr(exc, "status", None):
            return exc
    except Exception:
        pass
    status = getattr(exc, "status", None)
    plain = RuntimeError(str(exc) if isinstance(status, int) else f"{type(exc).__name__}: {exc}")
    if isinstance(status, int):
        plain.status = status  # type: ignore[attr-defined]
    if (param := getattr(exc, "param", None)) is not None:
        plain.param = param  # type: ignore[attr-defined]
    return plain
