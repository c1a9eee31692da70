"""What the output parsers make of a sample's text: content, reasoning and tool calls, whole or per streamed piece."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class Parsed:
    content: str
    reasoning_content: str | None = None
    tool_calls: list[ParsedToolCall] = field(default_factory=list)


@dataclass
class Delta:
    """What one fed piece of text adds: reasoning text, content text, tool calls completed in it."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)


class ToolStream(Protocol):
    """A tool-call splitter over content text, fed piece by piece: (content, calls completed) per piece."""

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ParsedToolCall]]: ...


class ToolParser(Protocol):
    """A --tool-parser: makes one stream per sample; `tools` are the request's (schemas some parsers type by)."""

    def stream(self, tools: list[Any] | None = None) -> ToolStream: ...


def partial_tag(text: str, tags: tuple[str, ...]) -> int:
    """Length of text's longest suffix that is a proper prefix of a tag (a streamed '<thi' may become one)."""
    for k in range(min(len(text), max(len(t) for t in tags) - 1), 0, -1):
        if any(t.startswith(text[-k:]) for t in tags):
            return k
    return 0
