"""Incremental reasoning / tool-call parsers: any split of an output streams what the whole-text parse returns."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from servers.openai.answers.parsers import OutputParser, Parsed, build_output_parser

CALL = '{"name": "f", "arguments": {"x": 1}}'
PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>", CALL, '{"arguments": {}}', "{bad", "\n", "\n\n", " ",
          "a", "bc", "é✓", "<", "</", "<th", "</thi", "<tool_", "think>", "call>"]
CONFIGS = [("qwen3", "hermes"), ("qwen3", None), (None, "hermes")]


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)] or [""]


def _calls(parsed: Parsed) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in parsed.tool_calls]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=14), st.lists(st.integers(0, 200), max_size=12),
       st.sampled_from(CONFIGS), st.booleans(), st.booleans())
def test_any_split_streams_the_whole_answer(parts, cuts, config, opened, use_tools):
    text = "".join(parts)
    parser = build_output_parser(*config)
    whole = parser.parse(text, use_tools=use_tools, opened=opened)
    stream = parser.stream(opened, use_tools)
    pieces = _split(text, cuts)
    deltas = [stream.feed(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)]
    assert "".join(d.reasoning for d in deltas) == (whole.reasoning_content or "")
    assert "".join(d.content for d in deltas) == whole.content
    assert [(c.name, c.arguments) for d in deltas for c in d.tool_calls] == _calls(whole)
    assert (stream.parsed().content, stream.parsed().reasoning_content) == (whole.content, whole.reasoning_content)


def _reference_think(text: str, opened: bool) -> tuple[str | None, str]:
    """The rule spelled out: the reasoning runs from the start (prompt opened it) or the first <think> to the first
    </think> after it, or to the end (empty: null, as vLLM answers); the newlines right after </think> are not
    content."""
    if not opened:
        if "<think>" not in text:
            return None, text
        before, _, text = text.partition("<think>")
    else:
        before = ""
    reasoning, found, after = text.partition("</think>")
    return reasoning or None, before + (after.lstrip("\n") if found else "")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES[:2] + PIECES[7:13]), max_size=12), st.booleans())
def test_think_follows_the_reference_rule(parts, opened):
    text = "".join(parts)
    out = build_output_parser("qwen3", None).parse(text, opened=opened)
    assert (out.reasoning_content, out.content) == _reference_think(text, opened)


def test_an_output_cut_off_mid_thought_is_reasoning():
    parser = build_output_parser("qwen3", "hermes")
    out = parser.parse("the street is", opened=True)
    assert (out.reasoning_content, out.content) == ("the street is", "")
    assert parser.parse("<think>the street is", opened=False).reasoning_content == "the street is"
    assert parser.parse("plain answer", opened=False).reasoning_content is None


def test_a_prompt_that_opens_think_is_recognised():
    parser = build_output_parser("qwen3", None).reasoning
    assert parser.opened_by("<|im_start|>assistant\n<think>\n")
    assert not parser.opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # enable_thinking=False
    assert not parser.opened_by("<|im_start|>assistant\n")


def test_malformed_blocks_stay_text_and_calls_are_emitted_when_closed():
    stream = build_output_parser(None, "hermes").stream()
    assert stream.feed("hi <tool_call>" + CALL[:10]).content == "hi"
    done = stream.feed(CALL[10:] + "</tool_call> <tool_call>{bad</tool_call>", final=True)
    assert [c.name for c in done.tool_calls] == ["f"]
    assert done.content == "  <tool_call>{bad</tool_call>"  # the whitespace held around the call, then the text
    assert json.loads(done.tool_calls[0].arguments) == {"x": 1}


def test_feeding_holds_back_only_a_partial_tag():
    """Linear work: what a reasoning or content stream holds between feeds is at most a tag's length."""
    stream = OutputParser(build_output_parser("qwen3", None).reasoning).stream(opened=True)
    text = ("word </thin k " * 2000) + "</think>" + ("x <thin " * 2000)
    for ch in text:
        stream.feed(ch)
        assert len(stream.think.pending) < len("</think>")
    parsed = stream.parsed()
    assert parsed.reasoning_content == "word </thin k " * 2000 and re.fullmatch(r"(x <thin )*x", parsed.content + "x")


def test_an_empty_reasoning_is_null_and_a_later_end_tag_stays_content():
    # vLLM answers an empty reasoning as null; a later </think> (a model forced to repeat it) stays content, as
    # vLLM's stream sends it (its unstreamed answer drops it: docs/vllm-compat.md). Catches "" for the reasoning
    parser = build_output_parser("qwen3", None)
    assert parser.parse("</think></think>", opened=True) == Parsed("</think>", None)
    assert parser.parse("a</think>\nb</think>c", opened=True) == Parsed("b</think>c", "a")
