"""Engine outputs to response fields: reasoning and tool-call parsing, logprobs, prompt logprobs, usage."""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from mm_infer.engine.outputs import CompletionOutput, RequestOutput
from servers.openai.replies import CompletionLogprobs, TokenLogprob, TopLogprob, Usage


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


LOGPROB_FLOOR = -9999.0  # what a -inf logprob (a masked token) is sent as: JSON has no infinity (vLLM's convention)


def json_logprob(lp: float) -> float:
    return lp if math.isfinite(lp) else LOGPROB_FLOOR


def json_logprobs(lps: list[float]) -> list[float]:
    return [lp if math.isfinite(lp) else LOGPROB_FLOOR for lp in lps]


def token_str(tokenizer: Any, token_id: int, as_id: bool) -> str:
    """A token as logprobs show it: its text, or `token_id:N` (vLLM's return_tokens_as_token_ids)."""
    return f"token_id:{token_id}" if as_id else tokenizer.decode([token_id], skip_special_tokens=False)


def _top(tokenizer: Any, alts: dict[int, float] | None, k: int, as_ids: bool) -> list[tuple[str, float]]:
    ranked = sorted((alts or {}).items(), key=lambda kv: -kv[1])[:k]
    return [(token_str(tokenizer, t, as_ids), json_logprob(lp)) for t, lp in ranked]


def chat_logprobs(tokenizer: Any, comp: CompletionOutput, start: int, k: int, as_ids: bool) -> list[TokenLogprob]:
    """OpenAI chat `logprobs.content` for tokens [start:] of one sample."""
    out = []
    for i in range(start, len(comp.token_ids)):
        token = token_str(tokenizer, comp.token_ids[i], as_ids)
        alts = comp.top_logprobs[i] if comp.top_logprobs and i < len(comp.top_logprobs) else None
        out.append(TokenLogprob(token=token, logprob=json_logprob(comp.logprobs[i]), bytes=list(token.encode("utf-8")),
                                top_logprobs=[TopLogprob(token=t, logprob=lp, bytes=list(t.encode("utf-8")))
                                              for t, lp in _top(tokenizer, alts, k, as_ids)]))
    return out


def _with_sampled(tokenizer: Any, token: int, lp: float | None, alts: dict[int, float] | None, k: int,
                  as_ids: bool) -> dict[str, float] | None:
    """vLLM's legacy top_logprobs entry: the chosen token first, then the top k (k = 0: the chosen token alone)."""
    if lp is None:
        return None
    top = {token_str(tokenizer, token, as_ids): json_logprob(lp)}
    for t, alt in _top(tokenizer, alts, k, as_ids):
        top.setdefault(t, alt)
    return top


def legacy_logprobs(tokenizer: Any, ids: list[int], lps: list[float | None], alts: list[dict[int, float] | None],
                    k: int, as_ids: bool, at: int = 0) -> CompletionLogprobs:
    """Legacy text-completion logprobs of `ids`: tokens, token_logprobs, top_logprobs, text_offset from `at`."""
    tokens = [token_str(tokenizer, t, as_ids) for t in ids]
    offsets = []
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return CompletionLogprobs(
        tokens=tokens, token_logprobs=[None if lp is None else json_logprob(lp) for lp in lps], text_offset=offsets,
        top_logprobs=[_with_sampled(tokenizer, t, lp, a, k, as_ids) for t, lp, a in zip(ids, lps, alts, strict=True)])


def completion_logprobs(tokenizer: Any, comp: CompletionOutput, k: int, as_ids: bool, start: int = 0,
                        at: int = 0) -> CompletionLogprobs:
    """Legacy logprobs of generated tokens [start:], text offsets counted from `at`."""
    n = len(comp.token_ids)
    alts = [comp.top_logprobs[i] if comp.top_logprobs and i < len(comp.top_logprobs) else None for i in range(start, n)]
    return legacy_logprobs(tokenizer, comp.token_ids[start:], list(comp.logprobs[start:]), alts, k, as_ids, at)


def echo_logprobs(tokenizer: Any, out: RequestOutput, k: int, as_ids: bool) -> CompletionLogprobs:
    """Legacy logprobs of the prompt tokens (echo): the first has none."""
    ids = list(out.prompt_token_ids)
    lps = list(out.prompt_logprobs or [None] * len(ids))
    alts = list(out.prompt_top_logprobs or [None] * len(ids))
    return legacy_logprobs(tokenizer, ids, lps, alts, k, as_ids)


def join_logprobs(head: CompletionLogprobs, tail: CompletionLogprobs) -> CompletionLogprobs:
    """head's tokens then tail's, tail's text offsets moved past head's text."""
    shift = head.text_offset[-1] + len(head.tokens[-1]) if head.tokens else 0
    return CompletionLogprobs(tokens=head.tokens + tail.tokens,
                              token_logprobs=head.token_logprobs + tail.token_logprobs,
                              top_logprobs=(head.top_logprobs or []) + (tail.top_logprobs or []),
                              text_offset=head.text_offset + [o + shift for o in tail.text_offset])


def prompt_logprobs(tokenizer: Any, out: RequestOutput, as_ids: bool) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM shape: None for the first prompt token, then {token_id: {logprob, rank, decoded_token}}: the prompt
    token itself (its real rank, 1 = the most likely), then the top k alternatives (ranks 1..k)."""
    lps = out.prompt_logprobs or []
    ranks = out.prompt_ranks or []
    tops = out.prompt_top_logprobs or []
    result: list[dict[str, dict[str, Any]] | None] = []
    for i, token in enumerate(out.prompt_token_ids):
        lp = lps[i] if i < len(lps) else None
        if lp is None:
            result.append(None)
            continue
        entry = {str(token): {"logprob": json_logprob(lp), "rank": ranks[i] if i < len(ranks) else None,
                              "decoded_token": token_str(tokenizer, token, as_ids)}}
        ranked = sorted((tops[i] if i < len(tops) and tops[i] else {}).items(), key=lambda kv: -kv[1])
        for r, (alt, alt_lp) in enumerate(ranked, start=1):
            entry.setdefault(str(alt), {"logprob": json_logprob(alt_lp), "rank": r,
                                        "decoded_token": token_str(tokenizer, alt, as_ids)})
        result.append(entry)
    return result


def running_usage(options: Any, prompt_tokens: int) -> Callable[[int], Usage | None]:
    """vLLM's stream_options.continuous_usage_stats (with include_usage): usage so far on every chunk."""
    on = options is not None and options.include_usage and options.continuous_usage_stats

    def so_far(generated: int) -> Usage | None:
        if not on:
            return None
        return Usage(prompt_tokens=prompt_tokens, completion_tokens=generated, total_tokens=prompt_tokens + generated)
    return so_far


def usage(out: RequestOutput) -> Usage:
    generated = sum(len(c.token_ids) for c in out.outputs)
    prompt = len(out.prompt_token_ids)
    return Usage(prompt_tokens=prompt, completion_tokens=generated, total_tokens=prompt + generated,
                 prompt_tokens_details={"cached_tokens": out.num_cached_tokens})
