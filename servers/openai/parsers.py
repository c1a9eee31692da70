"""Output parsers (text in; remaining text + parsed metadata out): <think> reasoning, Hermes/Qwen tool calls."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Protocol


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


class Parser(Protocol):
    """One parser step; `final=False` while streaming: hold back text that may still become markup."""

    def parse(self, text: str, final: bool = True) -> Parsed: ...


def _hold_back(text: str, tags: tuple[str, ...]) -> str:
    """text minus a trailing partial prefix of any tag (so a streamed '<thi' is not sent as content)."""
    for k in range(min(len(text), max(len(t) for t in tags)), 0, -1):
        if any(t.startswith(text[-k:]) for t in tags):
            return text[:-k]
    return text


class ThinkParser:
    """`<think>reasoning</think>content` -> reasoning_content + content; the start tag may be in the prompt."""

    def __init__(self, start: str = "<think>", end: str = "</think>") -> None:
        self.start, self.end = start, end

    def parse(self, text: str, final: bool = True) -> Parsed:
        if self.end in text:
            reasoning, _, content = text.partition(self.end)
            reasoning = reasoning.split(self.start, 1)[1] if self.start in reasoning else reasoning
            return Parsed(content.lstrip("\n") if final else content, reasoning)
        if self.start in text:
            before, _, reasoning = text.partition(self.start)
            return Parsed(before, reasoning if final else _hold_back(reasoning, (self.end,)))
        return Parsed(text if final else _hold_back(text, (self.start, self.end)))


class HermesToolParser:
    """Hermes / Qwen `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks -> tool_calls."""

    start, end = "<tool_call>", "</tool_call>"
    _block = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def parse(self, text: str, final: bool = True) -> Parsed:
        if not final:  # tool calls are emitted once complete; stream only the text before the first one
            head = text.split(self.start, 1)[0]
            return Parsed(head if self.start in text else _hold_back(head, (self.start,)))
        calls: list[ParsedToolCall] = []
        for body in self._block.findall(text):
            try:
                obj = json.loads(body)
            except json.JSONDecodeError:
                return Parsed(text)  # malformed markup stays visible as text
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return Parsed(text)
            args = obj.get("arguments", obj.get("parameters", {}))
            arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            calls.append(ParsedToolCall(f"call_{uuid.uuid4().hex[:24]}", obj["name"], arguments))
        if not calls:
            return Parsed(text)
        remaining = self._block.sub("", text).strip()
        return Parsed(remaining, tool_calls=calls)


class OutputParser:
    """The server's chain: reasoning first, then tool calls on what remains."""

    def __init__(self, reasoning: Parser | None = None, tools: Parser | None = None) -> None:
        self.reasoning = reasoning
        self.tools = tools

    @property
    def active(self) -> bool:
        return self.reasoning is not None or self.tools is not None

    def parse(self, text: str, final: bool = True, use_tools: bool = True) -> Parsed:
        out = self.reasoning.parse(text, final) if self.reasoning else Parsed(text)
        if self.tools is not None and use_tools:
            parsed = self.tools.parse(out.content, final)
            out = Parsed(parsed.content, out.reasoning_content, parsed.tool_calls)
        return out


REASONING_PARSERS = {"qwen3": ThinkParser, "deepseek_r1": ThinkParser, "think": ThinkParser}
TOOL_PARSERS = {"hermes": HermesToolParser, "qwen": HermesToolParser}


def build_output_parser(reasoning: str | None, tools: str | None) -> OutputParser:
    for name, table, flag in ((reasoning, REASONING_PARSERS, "--reasoning-parser"),
                              (tools, TOOL_PARSERS, "--tool-parser")):
        if name is not None and name not in table:
            raise ValueError(f"{flag} {name!r} is unknown; choose one of {sorted(table)}")
    return OutputParser(REASONING_PARSERS[reasoning]() if reasoning else None,
                        TOOL_PARSERS[tools]() if tools else None)
