"""The `qwen3_coder` tool parser (Qwen3.5, Qwen3-Coder XML calls): vLLM 0.32's answers on recorded texts, typed
arguments, and any split of a text streaming what the whole-text parse returns."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from mm_infer.engine.outputs.request_output import CompletionOutput
from servers.cli import parse_args
from servers.openai.answers.parsers import TOOL_PARSERS, build_output_parser
from servers.openai.answers.qwen3_coder_tools import Qwen3CoderToolParser, tool_properties, xml_arguments
from servers.openai.answers.tool_arg_types import coerce, schema_types, typed_arguments
from servers.openai.bodies.requests import ChatCompletionRequest, Tool
from servers.openai.endpoints.chat import _delta, _Sent, parse_with_span

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = json.loads((ROOT / "tests/golden/qwen3_coder_tools/vllm.json").read_text())  # scripts/peers/record_...
TOOLS = FIXTURE["tools"]
CASES = {c["name"]: c for c in FIXTURE["cases"]}
# where we answer otherwise than vLLM's whole answer, on purpose: the content we give instead
DELIBERATE = {
    "content_after": "Done.",  # vLLM drops text after a call when unstreamed; its stream keeps it, as we do
    "content_between": "and also",
    "hermes_json_in_block": CASES["hermes_json_in_block"]["text"],  # a block with no call: we keep it as text
    "empty_name": CASES["empty_name"]["text"],
    "empty_block": "a <tool_call></tool_call> b",
}
PARSER = Qwen3CoderToolParser()


def _calls(parsed) -> list[list[str]]:
    return [[c.name, c.arguments] for c in parsed.tool_calls]


def _stream(text_pieces: list[str], tools=TOOLS) -> tuple[str, list[list[str]]]:
    stream = PARSER.stream(tools)
    fed = [stream.feed(p, final=i == len(text_pieces) - 1) for i, p in enumerate(text_pieces)]
    return "".join(c for c, _ in fed), [[k.name, k.arguments] for _, calls in fed for k in calls]


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)] or [""]


@pytest.mark.parametrize("name", sorted(CASES))
def test_answers_as_vllm_does(name):
    case = CASES[name]
    parsed = PARSER.parse(case["text"], tools=TOOLS)
    assert _calls(parsed) == case["whole"]["calls"]
    expected = DELIBERATE.get(name, case["whole"]["content"])
    assert (parsed.content or None) == (expected or None)


def test_the_deliberate_differences_are_still_differences():
    """Each allowance names a case where vLLM's whole answer is otherwise (else it is stale)."""
    for name, ours in DELIBERATE.items():
        assert (CASES[name]["whole"]["content"] or None) != ours, name


@pytest.mark.parametrize("name", sorted(CASES))
def test_char_by_char_streams_the_whole_answer(name):
    text = CASES[name]["text"]
    whole = PARSER.parse(text, tools=TOOLS)
    assert _stream(list(text) or [""]) == (whole.content, _calls(whole))


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(ROOT / "assets/models/tiny-qwen3.5"))


def test_token_by_token_streams_the_whole_answer(tokenizer):
    """Pieces as the server decodes them (each token's new text), for every recorded text."""
    for case in FIXTURE["cases"]:
        ids, pieces, sent = tokenizer.encode(case["text"], add_special_tokens=False), [], 0
        for k in range(1, len(ids) + 1):
            text = tokenizer.decode(ids[:k])
            if not text.endswith("\ufffd"):  # a character still cut between tokens waits, as the server's does
                pieces.append(text[sent:])
                sent = len(text)
        whole = PARSER.parse(case["text"], tools=TOOLS)
        assert _stream(pieces) == (whole.content, _calls(whole)), case["name"]


PIECES = ["<tool_call>", "</tool_call>", "<function=get_weather>", "<function=", "</function>", "<parameter=days>",
          "<parameter=city>", "</parameter>", ">", "3", "Paris", "\n", " ", "x", "<", "</", "<tool_", "</func", "é✓",
          "</think>", '{"name": "f"}']


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=16), st.lists(st.integers(0, 300), max_size=12))
def test_any_split_streams_the_whole_answer(parts, cuts):
    text = "".join(parts)
    whole = PARSER.parse(text, tools=TOOLS)
    assert _stream(_split(text, cuts)) == (whole.content, _calls(whole))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=16))
def test_nothing_is_lost_without_calls(parts):
    """A text that yields no call is its own content, every tag and blank kept; one with calls keeps its words."""
    text = "".join(parts)
    parsed = PARSER.parse(text, tools=TOOLS)
    if not parsed.tool_calls:
        assert parsed.content == text
    else:
        assert all(json.loads(c.arguments) is not None for c in parsed.tool_calls)


def test_arguments_follow_the_schema_types():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n 12 \n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n<parameter=t>\n2.50\n</parameter>\n<parameter=metric>\nfalse\n</parameter>\n"
            "<parameter=opts>\n{\"a\": null}\n</parameter>\n<parameter=other>\n7\n</parameter>\n</function>\n"
            "</tool_call>")
    call = PARSER.parse(text, tools=TOOLS).tool_calls[0]
    assert json.loads(call.arguments) == {"city": " 12 ", "days": 3, "t": 2.5, "metric": False, "opts": {"a": None},
                                          "other": "7"}  # a string stays raw, an unknown key a string
    untyped = PARSER.parse(text).tool_calls[0]  # no tools in the request: every value a string
    assert json.loads(untyped.arguments)["days"] == "3"


def test_type_rules():
    assert schema_types({"type": ["integer", "null"]}) == {"integer", "null"}
    assert schema_types({"enum": ["a", 1, None, True]}) == {"string", "integer", "null", "boolean"}
    assert schema_types({"anyOf": [{"type": "number"}, "junk"]}) == {"number", "string"}
    assert schema_types("junk") == schema_types({}) == {"string"}
    assert coerce("null", {"integer", "null"}) is None
    assert (coerce("4.0", {"integer"}), coerce("4.5", {"int"})) == (4, 4.5)  # falls back to what JSON reads
    assert coerce("inf", {"number"}) == "inf" and coerce("[1e999]", {"array"}) == "[1e999]"
    assert (coerce("1", {"bool"}), coerce("no", {"boolean"})) == (True, "no")
    assert coerce("{bad", {"object"}) == "{bad"
    assert typed_arguments('"not an object"', {"a": {"type": "integer"}}) == '"not an object"'
    assert typed_arguments("{bad", {"a": {"type": "integer"}}) == "{bad"
    assert typed_arguments('{"a":"1"}', {}) == '{"a":"1"}'  # no properties: left exactly as written
    assert typed_arguments('{"a": {"b": "2"}, "c": ["3"]}', {"a": {"properties": {"b": {"type": "integer"}}},
                                                             "c": {"items": {"type": "integer"}}}) == \
        '{"a": {"b": 2}, "c": [3]}'
    assert typed_arguments('{"a": 5}', {"a": {"type": "string"}}) == '{"a": "5"}'


def test_parameters_are_read_as_vllm_reads_them():
    assert xml_arguments("<parameter=a>\n\nx\n\n</parameter>") == '{"a": "\\nx\\n"}'  # one newline off each side
    assert xml_arguments("<parameter=a>1<parameter=b>2") == '{"a": "1"}'  # the last one never closed
    assert xml_arguments("no parameters") == "{}"


def test_tool_properties_from_requests():
    tools = [Tool.model_validate(t) for t in TOOLS]
    assert tool_properties(tools) == tool_properties(TOOLS)
    assert tool_properties(TOOLS)["ping"] == {}
    assert tool_properties([{"type": "function", "function": {"name": "a", "parameters": {"properties": "junk"}}},
                            {"type": "function", "function": {"name": "a", "parameters": {"properties": {"x": {}}}}},
                            {"type": "custom", "function": {"name": "b"}}, {"function": {"name": 3}}]) == {"a": {}}


def test_calls_have_vllm_ids():
    parsed = PARSER.parse(CASES["two_calls"]["text"], tools=TOOLS)
    ids = [c.id for c in parsed.tool_calls]
    assert all(re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", i) for i in ids) and len(set(ids)) == 2


def test_registered_for_the_flag():
    assert TOOL_PARSERS["qwen3_coder"] is Qwen3CoderToolParser
    config = parse_args(["serve", str(ROOT / "assets/models/tiny-qwen3.5"), "--tool-call-parser", "qwen3_coder",
                         "--enable-auto-tool-choice"])
    assert config.tool_parser == "qwen3_coder"
    with pytest.raises(ValueError, match="qwen3_coder"):
        build_output_parser(None, "qwen3_coders")


def test_after_reasoning_the_calls_are_read_from_the_content():
    text = "<think>weigh it</think>\n\nOK.\n" + CASES["one_call"]["text"]
    parsed = build_output_parser("qwen3", "qwen3_coder").parse(text, tools=TOOLS)
    assert (parsed.reasoning_content, parsed.content, _calls(parsed)) == (
        "weigh it", "OK.", [["get_weather", '{"city": "Paris", "days": 3}']])


def _request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS, **fields)


def test_the_server_types_arguments_by_the_request_tools_and_ends_with_tool_calls():
    state = SimpleNamespace(parser=build_output_parser(None, "qwen3_coder"))
    text = CASES["content_before"]["text"]
    parsed, _ = parse_with_span(state, _request(), text, False)
    assert _calls(parsed) == [["get_weather", '{"city": "Paris", "days": 3}']] and parsed.content == "Let me check."
    sent, pieces, chunks = _Sent(), _split(text, [5, 20, 40, 60]), []
    for i, piece in enumerate(pieces):
        final = i == len(pieces) - 1
        chunks.append(_delta(state, _request(stream=True), CompletionOutput(0, piece, [i], [0.0],
                                                                            "stop" if final else None), sent))
    calls = [tc for c in chunks for tc in c["delta"].get("tool_calls") or []]
    assert [(tc.index, tc.function.name, tc.function.arguments) for tc in calls] == [
        (0, "get_weather", '{"city": "Paris", "days": 3}')]
    assert chunks[-1]["finish_reason"] == "tool_calls"
    assert "".join(c["delta"].get("content") or "" for c in chunks) == "Let me check."


def test_tool_choice_none_leaves_the_markup_as_content():
    state = SimpleNamespace(parser=build_output_parser(None, "qwen3_coder"))
    text = CASES["one_call"]["text"]
    parsed, _ = parse_with_span(state, _request(tool_choice="none"), text, False)
    assert (parsed.content, parsed.tool_calls) == (text, [])


def test_blanks_around_a_call_are_dropped_however_they_arrive():
    call = CASES["one_call"]["text"]
    text = "a \n" + call + "\n \nb  "
    assert (PARSER.parse(text, tools=TOOLS).content, PARSER.parse(text + "\n").content) == ("a \nb", "a \nb")
    assert _stream(["a ", "\n", call, "\n", " ", "\n", "b", "  "])[0] == "a \nb"
