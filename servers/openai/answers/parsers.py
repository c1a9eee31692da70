"""Reasoning and tool-call parsers over a sample's text, whole or as it streams, and reasoning token counts."""

from __future__ import annotations

import json
import uuid
from bisect import bisect_left, bisect_right
from typing import Any

from servers.openai.answers.parsed import Delta, Parsed, ParsedToolCall, ToolParser, ToolStream
from servers.openai.answers.parsed import partial_tag as _partial_tag
from servers.openai.answers.qwen3_coder_tools import Qwen3CoderToolParser


class ThinkStream:
    """Incremental `<think>reasoning</think>content` splitter: before (content, a start tag may come), in the
    reasoning, after it (content; the newlines right after the end tag are dropped). Linear in the text fed."""

    def __init__(self, start: str, end: str, opened: bool) -> None:
        self.start, self.end = start, end
        self.state = "think" if opened else "before"
        self.entered = opened  # a reasoning section exists (its text may be empty)
        self.pending = ""  # held back: may be the start of a tag
        self.pos = 0  # raw characters before `pending`
        self.span: tuple[int, int | None] | None = (0, None) if opened else None  # reasoning's raw char range
        self.skip_newlines = False

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning, content) that `text` completes; `final` flushes what was held back."""
        buf, reasoning, content = self.pending + text, [], []
        while buf:
            if self.state == "after":
                kept = buf.lstrip("\n") if self.skip_newlines else buf
                self.skip_newlines = self.skip_newlines and not kept
                content.append(kept)
                self.pos, buf = self.pos + len(buf), ""
                break
            tag = self.end if self.state == "think" else self.start
            out = reasoning if self.state == "think" else content
            if (i := buf.find(tag)) >= 0:
                out.append(buf[:i])
                self._switch(self.pos + i, self.pos + i + len(tag))
                self.pos, buf = self.pos + i + len(tag), buf[i + len(tag):]
                continue
            keep = 0 if final else _partial_tag(buf, (tag,))
            out.append(buf[:len(buf) - keep])
            self.pos, buf = self.pos + len(buf) - keep, buf[len(buf) - keep:]
            break
        self.pending = buf
        return "".join(reasoning), "".join(content)

    def _switch(self, tag_at: int, after: int) -> None:
        if self.state == "think":
            self.state, self.skip_newlines = "after", True
            self.span = (self.span[0] if self.span else 0, tag_at)
        else:
            self.state, self.entered, self.span = "think", True, (after, None)


class ThinkParser:
    """`<think>reasoning</think>content` -> reasoning_content + content; the start tag may be in the prompt
    (`opened`): then everything up to the end tag, or all of an output cut off before it, is reasoning."""

    def __init__(self, start: str = "<think>", end: str = "</think>") -> None:
        self.start, self.end = start, end

    def opened_by(self, prompt_tail: str) -> bool:
        """Whether a rendered prompt ending in `prompt_tail` leaves a reasoning section open (`...<think>\\n`)."""
        return prompt_tail.rstrip().endswith(self.start)

    def guess_opened(self, text: str) -> bool:
        """For a whole text whose prompt is unknown: an end tag with no start tag before it was opened there."""
        head, found, _ = text.partition(self.end)
        return bool(found) and self.start not in head

    def stream(self, opened: bool = False) -> ThinkStream:
        return ThinkStream(self.start, self.end, opened)

    def parse(self, text: str, final: bool = True, opened: bool | None = None) -> Parsed:
        s = self.stream(self.guess_opened(text) if opened is None else opened)
        reasoning, content = s.feed(text, final)
        return Parsed(content, (reasoning or None) if s.entered else None)  # vLLM: an empty reasoning is null


class HermesStream:
    """Incremental Hermes tool-call splitter over content text: text (whitespace before a call or at the end is
    held, and dropped once there are calls), and `<tool_call>` blocks emitted whole when their end tag arrives; a
    block that is not a JSON call with a string name stays visible as text."""

    start, end = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        self.pending = ""
        self.in_call = False
        self.space = ""  # trailing whitespace not yet sent
        self.calls = 0
        self.searched = 0  # pending's characters already searched for the end tag (a call's body is held whole)

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ParsedToolCall]]:
        buf, content, calls = self.pending + text, [], []
        while buf:
            tag = self.end if self.in_call else self.start
            if (i := buf.find(tag, self.searched)) >= 0:
                self.searched = 0
                if self.in_call:
                    call = _hermes_call(buf[:i])
                    calls += [call] if call else []
                    content += [] if call else [self._text(self.start + buf[:i + len(tag)])]
                else:
                    content.append(self._text(buf[:i]))
                self.in_call, buf = not self.in_call, buf[i + len(tag):]
                continue
            if self.in_call:
                content += [self._text(self.start + buf)] if final else []
                buf = "" if final else buf
                self.searched = max(0, len(buf) - len(tag) + 1)
            else:
                keep = 0 if final else _partial_tag(buf, (tag,))
                content.append(self._text(buf[:len(buf) - keep]))
                buf = buf[len(buf) - keep:]
            break
        self.pending = buf
        self.calls += len(calls)
        if final and not self.calls:
            content.append(self.space)
        return "".join(content), calls

    def _text(self, text: str) -> str:
        """text after the held whitespace, minus its own trailing whitespace (held in turn)."""
        joined = self.space + text
        body = joined.rstrip()
        self.space = joined[len(body):]
        return body


def _hermes_call(body: str) -> ParsedToolCall | None:
    """One block's `{"name": ..., "arguments": {...}}` as a call, or None when it is not one."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))  # whatever JSON value the model wrote, as JSON text
    return ParsedToolCall(f"call_{uuid.uuid4().hex[:24]}", obj["name"], json.dumps(args, ensure_ascii=False))


class HermesToolParser:
    """Hermes / Qwen `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks -> tool_calls."""

    start, end = HermesStream.start, HermesStream.end

    def stream(self, tools: list[Any] | None = None) -> HermesStream:
        return HermesStream()

    def parse(self, text: str, final: bool = True, tools: list[Any] | None = None) -> Parsed:
        content, calls = self.stream(tools).feed(text, final)
        return Parsed(content, tool_calls=calls)


class OutputStream:
    """The server's chain fed incrementally: reasoning first, then tool calls on the content; `parsed()` is all of
    it so far (the same whatever the pieces were)."""

    def __init__(self, think: ThinkStream | None, tools: ToolStream | None) -> None:
        self.think, self.tools = think, tools
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.calls: list[ParsedToolCall] = []

    def feed(self, text: str, final: bool = False) -> Delta:
        reasoning, content = self.think.feed(text, final) if self.think else ("", text)
        calls: list[ParsedToolCall] = []
        if self.tools is not None:
            content, calls = self.tools.feed(content, final)
        self.reasoning.append(reasoning)
        self.content.append(content)
        self.calls += calls
        return Delta(reasoning, content, calls)

    def parsed(self) -> Parsed:
        entered = self.think is not None and self.think.entered
        return Parsed("".join(self.content), ("".join(self.reasoning) or None) if entered else None,
                      list(self.calls))

    @property
    def reasoning_span(self) -> tuple[int, int | None] | None:
        """The reasoning's raw character range in the text fed (end None: still open), or None."""
        return self.think.span if self.think else None


class OutputParser:
    """The server's chain: reasoning first, then tool calls on what remains."""

    def __init__(self, reasoning: ThinkParser | None = None, tools: ToolParser | None = None) -> None:
        self.reasoning = reasoning
        self.tools = tools

    @property
    def active(self) -> bool:
        return self.reasoning is not None or self.tools is not None

    def stream(self, opened: bool = False, use_tools: bool = True, tools: list[Any] | None = None) -> OutputStream:
        """`tools`: the request's, for a tool parser that types arguments by their schemas."""
        return OutputStream(self.reasoning.stream(opened) if self.reasoning else None,
                            self.tools.stream(tools) if self.tools is not None and use_tools else None)

    def parse(self, text: str, final: bool = True, use_tools: bool = True, opened: bool | None = None,
              tools: list[Any] | None = None) -> Parsed:
        if opened is None:
            opened = self.reasoning is not None and self.reasoning.guess_opened(text)
        s = self.stream(opened, use_tools, tools)
        s.feed(text, final)
        return s.parsed()

    def opened_by(self, tokenizer: Any, prompt_token_ids: list[int]) -> bool:
        """Whether the prompt (its last tokens, decoded) leaves a reasoning section open."""
        if self.reasoning is None or not prompt_token_ids:
            return False
        tail = tokenizer.decode(list(prompt_token_ids[-PROMPT_TAIL_TOKENS:]), skip_special_tokens=False)
        return self.reasoning.opened_by(tail)


PROMPT_TAIL_TOKENS = 32  # prompt tokens decoded to see whether the template opened a reasoning section


def reasoning_tokens(tokenizer: Any, token_ids: list[int], span: tuple[int, int | None] | None,
                     skip_special_tokens: bool = True) -> int:
    """Generated tokens wholly inside the reasoning's character range (vLLM's count: its tags are not reasoning);
    token i covers [L(i), L(i+1)) where L(k) is the length of the first k tokens decoded (found by bisection)."""
    if span is None or not token_ids:
        return 0
    ids = list(token_ids)

    def length(k: int) -> int:
        return len(tokenizer.decode(ids[:k], skip_special_tokens=skip_special_tokens))

    first = bisect_left(range(len(ids) + 1), span[0], key=length)
    last = len(ids) if span[1] is None else bisect_right(range(len(ids) + 1), span[1], key=length) - 1
    return max(0, last - first)


REASONING_PARSERS = {"qwen3": ThinkParser, "deepseek_r1": ThinkParser, "think": ThinkParser}
TOOL_PARSERS = {"hermes": HermesToolParser, "qwen": HermesToolParser, "qwen3_coder": Qwen3CoderToolParser}


def build_output_parser(reasoning: str | None, tools: str | None) -> OutputParser:
    for name, table, flag in ((reasoning, REASONING_PARSERS, "--reasoning-parser"),
                              (tools, TOOL_PARSERS, "--tool-parser")):
        if name is not None and name not in table:
            raise ValueError(f"{flag} {name!r} is unknown; choose one of {sorted(table)}")
    return OutputParser(REASONING_PARSERS[reasoning]() if reasoning else None,
                        TOOL_PARSERS[tools]() if tools else None)
