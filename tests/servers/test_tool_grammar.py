"""The tool-call grammar a request gets (vLLM 0.32's hermes structural tag), checked by what xgrammar accepts."""

from __future__ import annotations

import json
from typing import Any

import pytest
import xgrammar as xgr
from server_cases import CKPT
from transformers import AutoTokenizer

from servers.openai.bodies.requests import ChatCompletionRequest
from servers.openai.bodies.tool_grammar import ToolStrictLevel, tool_call_tag

PARAMS = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}


def tool(name: str, strict: bool | None = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": PARAMS, "strict": strict}}


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(CKPT)))


def accepts(compiler: xgr.GrammarCompiler, tag: str | None, text: str) -> bool:
    """Whether the tag's grammar takes the whole text and may end there."""
    assert tag is not None
    matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(tag))
    return matcher.accept_string(text) and matcher.is_completed()


def tag_for(level: ToolStrictLevel | None = ToolStrictLevel.AUTO, other: bool = False, **fields: Any) -> str | None:
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], **fields)
    return tool_call_tag(req, level, False, other)


NAMED = {"type": "function", "function": {"name": "get_weather"}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": %s}\n</tool_call>'


def test_a_forced_call_holds_arguments_to_the_schema_only_when_the_tool_is_strict(compiler):
    # catches: arguments schema-enforced for a tool without strict (vLLM's level auto lets them be any JSON value,
    # and the two servers' greedy outputs part there), or a strict tool's schema dropped
    loose, strict = tag_for(tools=[tool("get_weather")], tool_choice=NAMED), \
        tag_for(tools=[tool("get_weather", True)], tool_choice=NAMED)
    assert accepts(compiler, loose, CALL % "true") and accepts(compiler, loose, CALL % '{"city": "Oslo"}')
    assert not accepts(compiler, strict, CALL % "true") and accepts(compiler, strict, CALL % '{"city": "Rome"}')
    param = tag_for(ToolStrictLevel.PARAMETER, tools=[tool("get_weather")], tool_choice=NAMED)
    assert not accepts(compiler, param, CALL % "true") and accepts(compiler, param, CALL % '{"city": "Paris"}')
    off = tag_for(ToolStrictLevel.PARAMETER, tools=[tool("get_weather", False)], tool_choice=NAMED)
    assert not accepts(compiler, off, CALL % "true"), "level parameter holds even a tool that says strict: false"


def test_both_hermes_envelopes_and_no_separator(compiler):
    # catches: only the newline envelope allowed, or a separator vLLM's grammar does not write between calls
    tag = tag_for(tools=[tool("get_weather"), tool("set_flag")], tool_choice="required")
    tight = '<tool_call>{"name": "set_flag", "arguments": 1}</tool_call>'
    assert accepts(compiler, tag, tight) and accepts(compiler, tag, CALL % "1" + tight)
    assert not accepts(compiler, tag, CALL % "1" + "\n" + tight)
    assert not accepts(compiler, tag, "hello " + tight), "a forced call has no text before it"


def test_named_and_single_calls_stop_after_the_first(compiler):
    # catches: a second call allowed for a named tool_choice or with parallel_tool_calls false
    two = CALL % "1" + CALL % "2"
    assert not accepts(compiler, tag_for(tools=[tool("get_weather")], tool_choice=NAMED), two)
    assert not accepts(compiler, tag_for(tools=[tool("get_weather")], tool_choice="required",
                                         parallel_tool_calls=False), two)
    assert accepts(compiler, tag_for(tools=[tool("get_weather")], tool_choice="required"), two)


def test_auto_is_constrained_only_when_a_tool_or_the_level_asks(compiler):
    # catches: "auto" constrained without a strict tool (vLLM leaves it free), a strict tool's calls left free,
    # or a grammar without a tool parser on the server
    assert tag_for(tools=[tool("get_weather")], tool_choice="auto") is None
    assert tag_for(None, tools=[tool("get_weather", True)], tool_choice="auto") is None
    assert tag_for(tools=[tool("get_weather", True)], tool_choice="auto", other=True) is None
    assert tag_for(tools=[tool("get_weather", True)], tool_choice="none") is None
    strict = tag_for(tools=[tool("get_weather", True)], tool_choice="auto")
    assert accepts(compiler, strict, "Sunny.")
    assert accepts(compiler, strict, "Let me look. " + CALL % '{"city": "Rome"}')
    assert not accepts(compiler, strict, CALL % "true")
    floor = tag_for(ToolStrictLevel.FUNCTION, tools=[tool("get_weather")])
    assert accepts(compiler, floor, "x " + CALL % "true")
    single = tag_for(tools=[tool("get_weather")], parallel_tool_calls=False)
    assert single is not None and json.loads(single)["format"]["stop_after_first"] is True


def test_unknown_level_names_itself():
    with pytest.raises(ValueError, match="'loose'"):
        ToolStrictLevel.named("loose")
    assert ToolStrictLevel.named(" Parameter ") is ToolStrictLevel.PARAMETER
