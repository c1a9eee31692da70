"""Output parsers on strings: <think> reasoning, Hermes tool calls, streaming hold-back, the chain."""

from __future__ import annotations

import json

import pytest

from servers.openai.answers.parsers import HermesToolParser, OutputParser, ThinkParser, build_output_parser


def test_think_splits_reasoning_from_content():
    out = ThinkParser().parse("<think>step 1, step 2</think>\n\nThe answer is 4.")
    assert out.reasoning_content == "step 1, step 2" and out.content == "The answer is 4."


def test_think_start_tag_in_the_prompt():
    out = ThinkParser().parse("only reasoning here</think>answer")
    assert (out.reasoning_content, out.content) == ("only reasoning here", "answer")


def test_think_unclosed_and_absent():
    assert ThinkParser().parse("<think>still thinking").reasoning_content == "still thinking"
    plain = ThinkParser().parse("no tags at all")
    assert plain.content == "no tags at all" and plain.reasoning_content is None


def test_think_streaming_holds_back_partial_tags():
    assert ThinkParser().parse("hello <thi", final=False).content == "hello "
    assert ThinkParser().parse("<think>abc</th", final=False).reasoning_content == "abc"


def test_hermes_tool_calls():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    out = HermesToolParser().parse(text)
    assert out.content == "Let me check."
    assert [c.name for c in out.tool_calls] == ["get_weather", "get_time"]
    assert json.loads(out.tool_calls[0].arguments) == {"city": "Paris"}
    assert len({c.id for c in out.tool_calls}) == 2 and all(c.id.startswith("call_") for c in out.tool_calls)


@pytest.mark.parametrize("text", ["<tool_call>{not json}</tool_call>", '<tool_call>{"arguments": {}}</tool_call>',
                                  "<tool_call>{\"name\": \"f\"}", "plain text"])
def test_hermes_malformed_stays_text(text):
    out = HermesToolParser().parse(text)
    assert out.tool_calls == [] and out.content == text


def test_hermes_streaming_stops_at_the_tag():
    # the incremental parser also holds trailing whitespace (dropped if a call follows, as the whole-text parse
    # always did), so the streamed text is "abc", not "abc "
    assert HermesToolParser().parse("abc <tool_c", final=False).content == "abc"
    assert HermesToolParser().parse('abc <tool_call>{"na', final=False).content == "abc"
    assert HermesToolParser().parse("abc <tool_c", final=True).content == "abc <tool_c"


def test_chain_reasoning_then_tools():
    parser = build_output_parser("qwen3", "hermes")
    out = parser.parse('<think>use the tool</think><tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    assert out.reasoning_content == "use the tool" and out.tool_calls[0].name == "f" and out.content == ""
    no_tools = parser.parse('<tool_call>{"name": "f", "arguments": {}}</tool_call>', use_tools=False)
    assert no_tools.tool_calls == [] and "tool_call" in no_tools.content
    assert not OutputParser().active


def test_unknown_parser_names_fail():
    with pytest.raises(ValueError, match="--tool-parser"):
        build_output_parser(None, "nope")
