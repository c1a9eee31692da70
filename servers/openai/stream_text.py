"""What a stream may send of a sample's text so far: never a half character or a possible stop-string start."""

from __future__ import annotations

import json

from servers.openai.errors import error_body


def visible_text(text: str, final: bool, stop: str | list[str] | None) -> str:
    """text minus a trailing partial UTF-8 character and, while running, the longest stop string's length - 1."""
    if final:
        return text
    text = text.rstrip("\ufffd")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    hold = max((len(s) for s in stops), default=1) - 1
    return text[:len(text) - hold] if hold else text


def sse_error(status: int, message: str, type: str | None = None) -> str:
    """An error event in the middle of an SSE stream (the status line is long gone)."""
    return f"data: {json.dumps(error_body(status, message, type=type))}\n\n"
