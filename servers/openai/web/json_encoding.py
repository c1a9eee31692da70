"""JSON out with orjson: SSE events encoded once from plain dicts, whole answers encoded off the loop when large."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from fastapi.responses import Response
from pydantic import BaseModel

OFF_LOOP_ITEMS = 16384  # answers carrying more ids / logprobs than this are built and encoded on a thread


def _sse_default(obj: Any) -> Any:
    """A pydantic model inside an event dict: its fields as the model's own SSE encoding has them (no nulls)."""
    if isinstance(obj, BaseModel):
        return obj.model_dump(exclude_none=True)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def compact(**fields: Any) -> dict[str, Any]:
    """The fields that are not None, in order: what pydantic's exclude_none writes for one model."""
    return {k: v for k, v in fields.items() if v is not None}


def sse(event: BaseModel | dict[str, Any]) -> bytes:
    """One `data:` event: a dict (the hot path, built None-free with `compact`) by orjson, or a model without nulls."""
    if isinstance(event, BaseModel):
        return b"data: " + event.__pydantic_serializer__.to_json(event, exclude_none=True) + b"\n\n"
    return b"data: " + orjson.dumps(event, default=_sse_default) + b"\n\n"


def named_sse(kind: str, body: dict[str, Any]) -> str:
    """One `event: kind` SSE event (the Responses API's typed stream), its data encoded once by orjson."""
    return f"event: {kind}\ndata: {orjson.dumps(body, default=_sse_default).decode()}\n\n"


class JsonBody(Response):
    """An answer already encoded (or a model to encode): served as application/json as FastAPI would."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        if isinstance(content, bytes):
            return content
        if isinstance(content, BaseModel):
            return content.__pydantic_serializer__.to_json(content)
        return orjson.dumps(content)


async def json_answer(build: Callable[[], BaseModel], items: int) -> JsonBody:
    """The answer `build()` makes, encoded once; built and encoded on a thread when it carries more than
    OFF_LOOP_ITEMS ids and logprobs (that Python work then shares the GIL with the loop instead of blocking it)."""
    def encode() -> bytes:
        model = build()
        return model.__pydantic_serializer__.to_json(model)

    return JsonBody(await asyncio.to_thread(encode) if items > OFF_LOOP_ITEMS else encode())
