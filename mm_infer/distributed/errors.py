"""Errors of the replica layer; each carries the HTTP status the server answers with."""

from __future__ import annotations


class ReplicaUnavailableError(RuntimeError):
    """No replica can take the request, or the one serving it died: 503, never retried behind the caller's back."""

    status = 503


def describe_failure(exc: BaseException, limit: int = 240) -> str:
    """A one-line cause for an error message: the exception type and the first line of its text."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    first = first if len(first) <= limit else first[: limit - 3] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
