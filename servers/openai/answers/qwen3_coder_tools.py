"""vLLM 0.32's `qwen3_coder` tool calls (Qwen3.5, Qwen3-Coder): `<tool_call><function=NAME><parameter=KEY>VALUE
</parameter></function></tool_call>` read incrementally from content, values typed by the request's tool schemas."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from servers.openai.answers.parsed import Parsed, ParsedToolCall, partial_tag
from servers.openai.answers.tool_arg_types import typed_arguments

TOOL_START, TOOL_END = "<tool_call>", "</tool_call>"
FUNC_START, FUNC_END = "<function=", "</function>"
# every literal vLLM's lexer reads: inside a function name, one without a meaning there is part of the name
LITERALS = ("<think>", "</think>", TOOL_START, TOOL_END, FUNC_START, FUNC_END, "<parameter=", "</parameter>", ">")
# the tags that move each state on (vLLM's transitions); any other text there is content, ignored, name or arguments
MOVES = {"content": (TOOL_START, FUNC_START), "preamble": (TOOL_END, FUNC_START), "name": LITERALS,
         "args": (FUNC_END,), "between": (TOOL_END, TOOL_START, FUNC_START)}
_PARAM = re.compile(r"<\s*parameter\s*=\s*([^>]*)>(.*?)(?:<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=))", re.DOTALL)


def _first(text: str, tags: tuple[str, ...]) -> tuple[int, str | None]:
    """Where the earliest of the tags starts in text, and which (-1, None: none does)."""
    found = [(i, t) for t in tags if (i := text.find(t)) >= 0]
    return min(found) if found else (-1, None)


def _trim(value: str) -> str:
    """A value less one newline on each side (the template's markup)."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def xml_arguments(body: str) -> str:
    """The `<parameter=KEY>VALUE</parameter>` pairs of a function body as a JSON object of strings; a parameter
    that is never closed counts only when another opens after it; a repeated key keeps its first place."""
    return json.dumps({m.group(1): _trim(m.group(2)) for m in _PARAM.finditer(body)}, ensure_ascii=False)


def _json_call(body: str) -> tuple[str, str]:
    """A nameless function's body read as JSON `{"name": ..., "arguments": ...}` (vLLM's fallback): (name, args)."""
    try:
        obj = json.loads(body.strip())
    except ValueError:
        return "", ""
    if not isinstance(obj, dict) or not isinstance(name := obj.get("name", ""), str):
        return "", ""
    for key in ("arguments", "parameters"):
        if key in obj:
            args = obj[key]
            return name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return name, json.dumps({k: v for k, v in obj.items() if k != "name"}, ensure_ascii=False)


def function_call(name: str, body: str, properties: dict[str, dict[str, Any]]) -> ParsedToolCall | None:
    """One `<function=NAME>BODY</function>` as a call, or None when it names no function."""
    name, args = name.strip(), "{}"
    if name:
        args = xml_arguments(body)
    elif body.strip():
        name, args = _json_call(body)
    if not name:
        return None
    arguments = typed_arguments(args, properties.get(name, {}))
    return ParsedToolCall(f"chatcmpl-tool-{uuid.uuid4().int & (2**64 - 1):016x}", name, arguments)


def tool_properties(tools: list[Any] | None) -> dict[str, dict[str, Any]]:
    """Each function tool's parameter properties by its name (the first tool of a name wins)."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        spec = tool if isinstance(tool, dict) else tool.model_dump()
        function = spec.get("function") or {}
        props = (function.get("parameters") or {}).get("properties") or {}
        if spec.get("type", "function") == "function" and isinstance(function.get("name"), str):
            found.setdefault(function["name"], props if isinstance(props, dict) else {})
    return found


class Qwen3CoderStream:
    """Incremental splitter over content text, in vLLM's states: content; a block opened by `<tool_call>` (or a bare
    `<function=`) whose text before the function is ignored; the function's name up to `>`; its body up to
    `</function>`, when the call is emitted whole; ignored text until `</tool_call>` or the next call. A block that
    yields no call stays content, as written. Whitespace next to calls is dropped, as are trailing blanks when
    there are calls. Linear in the text fed."""

    def __init__(self, properties: dict[str, dict[str, Any]]) -> None:
        self.properties = properties
        self.state = "content"
        self.pending = ""  # held back: may be the start of a tag
        self.block: list[str] = []  # the open block's raw text, given back as content if it yields no call
        self.block_calls = 0
        self.name: list[str] = []
        self.body: list[str] = []
        self.space = ""  # content's trailing whitespace not yet sent
        self.after_call = False  # a call was the last thing: the content's next whitespace is dropped
        self.calls = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ParsedToolCall]]:
        buf, content, calls = self.pending + text, [], []
        while buf:
            tags = MOVES[self.state]
            i, tag = _first(buf, tags)
            if tag is None:
                keep = 0 if final else partial_tag(buf, tags)
                self._plain(buf[:len(buf) - keep], content)
                buf = buf[len(buf) - keep:]
                break
            self._plain(buf[:i], content)
            self._tag(tag, content, calls)
            buf = buf[i + len(tag):]
        self.pending = buf
        if final:
            self._finish(content, calls)
        return "".join(content), calls

    def _plain(self, text: str, content: list[str]) -> None:
        """Text between tags, as the state takes it."""
        if self.state == "content":
            content.append(self._text(text))
            return
        self.block.append(text)
        if self.state in ("name", "args"):
            (self.name if self.state == "name" else self.body).append(text)

    def _tag(self, tag: str, content: list[str], calls: list[ParsedToolCall]) -> None:
        if self.state == "content" or (self.state == "between" and tag != TOOL_END):
            self._close_block(content)
            self.block, self.block_calls = [tag], 0
            self._enter("preamble" if tag == TOOL_START else "name")
            return
        self.block.append(tag)
        if tag == FUNC_END and self.state in ("name", "args"):
            self._end_call(calls)
        elif self.state == "name":
            if tag == ">":
                self.state = "args"
            else:
                self.name.append(tag)  # a tag with no meaning inside a name is part of it
        elif tag == TOOL_END:
            self._close_block(content)
        else:
            self._enter("name")  # the block's <function=

    def _enter(self, state: str) -> None:
        self.state, self.name, self.body = state, [], []

    def _end_call(self, calls: list[ParsedToolCall]) -> None:
        call = function_call("".join(self.name), "".join(self.body), self.properties)
        if call is not None:
            calls.append(call)
            self.block_calls, self.calls, self.after_call = self.block_calls + 1, self.calls + 1, True
        self._enter("between")

    def _close_block(self, content: list[str]) -> None:
        if self.block and not self.block_calls:
            content.append(self._text("".join(self.block)))
        self.block, self.state = [], "content"

    def _finish(self, content: list[str], calls: list[ParsedToolCall]) -> None:
        """At the end: a function still open is a call (as vLLM ends one), an open block closes."""
        if self.state in ("name", "args"):
            self._end_call(calls)
        self._close_block(content)
        if not self.calls:
            content.append(self.space)
        self.space = ""

    def _text(self, text: str) -> str:
        """Content after the held whitespace, less its own trailing whitespace (held in turn)."""
        if self.after_call:
            text = text.lstrip()
            self.after_call = not text
        joined = self.space + text
        body = joined.rstrip()
        self.space = joined[len(body):]
        return body


class Qwen3CoderToolParser:
    """vLLM's `qwen3_coder` (and `qwen3_xml`) tool parser: XML function calls -> tool_calls with typed arguments."""

    def stream(self, tools: list[Any] | None = None) -> Qwen3CoderStream:
        return Qwen3CoderStream(tool_properties(tools))

    def parse(self, text: str, final: bool = True, tools: list[Any] | None = None) -> Parsed:
        content, calls = self.stream(tools).feed(text, final)
        return Parsed(content, tool_calls=calls)
