"""Why one request failed inside the engine loop (the loop itself goes on serving the others)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestError:
    """A failed request's HTTP-style status (400: its own parameters; 500: the engine) and a message naming why."""

    status: int
    message: str


class RequestFailedError(RuntimeError):
    """Raised to a request's caller when the engine failed that request (and only that request)."""

    def __init__(self, error: RequestError) -> None:
        super().__init__(error.message)
        self.status = error.status
        self.error = error


NONFINITE_MODEL = RequestError(
    500, "the model produced non-finite logits (NaN or inf) for this request: its weights or inputs are broken")
NONFINITE_PARAMS = RequestError(
    400, "this request's sampling parameters made the logits non-finite (NaN or inf); check repetition_penalty, "
         "logit_bias and temperature")


def step_failure(exc: BaseException) -> RequestError:
    return RequestError(500, f"the engine failed on this request: {type(exc).__name__}: {exc}")
