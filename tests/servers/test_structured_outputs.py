"""Structured outputs over HTTP: response_format, structured_outputs, guided_*, forced tool calls, 400s."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from servers.openai.answers.parsers import OutputParser
from servers.openai.bodies.requests import ChatCompletionRequest
from servers.openai.bodies.tool_grammar import request_parser

MODEL = "tiny-qwen2-vl"
SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}},
          "required": ["color", "ok"], "additionalProperties": False}
COMPACT = {"disable_any_whitespace": True}  # the tiny model would otherwise pad JSON with whitespace up to max_tokens
# strict tools: their arguments follow their schemas (vLLM's --tool-strict-level auto holds only strict tools)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
             "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "set_flag", "strict": True, "parameters": {
             "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}]
TOOL_ARGS = {"get_weather": {"city"}, "set_flag": {"on"}}


def chat(client, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": kw.pop("content", "Describe the weather.")}],
        max_tokens=kw.pop("max_tokens", 48), temperature=kw.pop("temperature", 1.0), seed=kw.pop("seed", 5), **kw)


def complete(client, extra: dict, **kw):
    return client.completions.create(model=MODEL, prompt="Answer:", max_tokens=kw.pop("max_tokens", 24),
                                     temperature=1.0, seed=kw.pop("seed", 5), extra_body=extra, **kw)


def valid(text: str) -> bool:
    obj = json.loads(text)
    return set(obj) == {"color", "ok"} and obj["color"] in ("red", "green") and isinstance(obj["ok"], bool)


def test_response_format_json_schema_under_n4(client):
    # catches: response_format ignored (the tiny model's text is not JSON) or one sample's grammar state leaking
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
    r = chat(client, n=4, response_format=fmt, extra_body={"structured_outputs": COMPACT})
    assert len(r.choices) == 4
    for c in r.choices:
        assert c.finish_reason == "stop" and valid(c.message.content), c.message.content


def test_completions_json_object_regex_choice_and_guided_names(client):
    # catches: the completions endpoint dropping the fields, the wrong kind compiled, vLLM's legacy names unread
    r = complete(client, {"response_format": {"type": "json_object"}, "structured_outputs": COMPACT}, max_tokens=64)
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].text), dict)
    r = complete(client, {"structured_outputs": {"regex": r"[a-z]{3}[0-9]{2}"}}, n=3)
    assert all(re.fullmatch(r"[a-z]{3}[0-9]{2}", c.text) for c in r.choices), [c.text for c in r.choices]
    choices = ["sunny", "light rain", "snow"]
    for extra in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
        r = complete(client, extra, n=3)
        assert all(c.text in choices and c.finish_reason == "stop" for c in r.choices), [c.text for c in r.choices]


def test_grammar_and_plain_requests_together(client):
    # catches: a grammar request masking a plain one that shares its steps (the server is batch invariant: the
    # plain greedy answer must equal the one it gets alone)
    plain = dict(temperature=0.0, max_tokens=12, logprobs=True)
    alone = chat(client, **plain)
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
    with ThreadPoolExecutor(3) as pool:
        shaped = pool.submit(chat, client, response_format=fmt, extra_body={"structured_outputs": COMPACT})
        picked = pool.submit(chat, client, extra_body={"structured_outputs": {"choice": ["a", "b"]}})
        mixed = pool.submit(chat, client, **plain)
        shaped, picked, mixed = shaped.result(), picked.result(), mixed.result()
    assert valid(shaped.choices[0].message.content) and picked.choices[0].message.content in ("a", "b")
    assert mixed.choices[0].message.content == alone.choices[0].message.content
    lps = [[t.logprob for t in r.choices[0].logprobs.content] for r in (mixed, alone)]
    assert lps[0] == lps[1]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "set_flag"}}],
                         ids=["required", "named"])
def test_forced_tool_calls_come_back_as_tool_calls(client, tool_choice):
    # catches: tool_choice required / named refused or not constrained (the tiny model never writes a call itself)
    r = chat(client, n=2, tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=False, max_tokens=64,
             extra_body={"structured_outputs": COMPACT})
    for c in r.choices:  # OpenAI's (and vLLM's) reason: tool_calls, but stop for a named function
        want = "stop" if isinstance(tool_choice, dict) else "tool_calls"
        assert c.finish_reason == want and len(c.message.tool_calls) == 1 and c.message.content == "", c.message
        call = c.message.tool_calls[0].function
        if isinstance(tool_choice, dict):
            assert call.name == "set_flag"
        assert set(json.loads(call.arguments)) == TOOL_ARGS[call.name]


def test_forced_tool_call_streamed(client):
    # catches: a streamed forced call sent as content text instead of a tool_calls delta
    stream = chat(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                  max_tokens=64, stream=True, extra_body={"structured_outputs": COMPACT})
    calls = [d for chunk in stream for ch in chunk.choices for d in (ch.delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "Rome")


def test_forced_calls_parse_without_a_configured_tool_parser():
    # catches: forced calls left as text on a server started without --tool-parser
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice="required")
    text = '<tool_call>\n{"name": "set_flag", "arguments": {"on": true}}\n</tool_call>'
    parsed = request_parser(OutputParser(), req).parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("set_flag", {"on": True})]
    assert request_parser(OutputParser(), ChatCompletionRequest(messages=req.messages)).parse(text).tool_calls == []


@pytest.mark.parametrize("kw, words", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
     "invalid JSON schema"),
    (dict(extra_body={"structured_outputs": {"regex": "a(b"}}), "invalid regex"),
    (dict(extra_body={"structured_outputs": {"grammar": "root ::= nothing"}}), "invalid EBNF grammar"),
    (dict(extra_body={"structured_outputs": {"json": "{not json"}}), "not a valid JSON schema"),
    (dict(response_format={"type": "json_object"}, extra_body={"guided_regex": "a+"}), "only one output constraint"),
    (dict(extra_body={"structured_outputs": {"regex": "a", "choice": ["b"]}}), "only one output constraint"),
    (dict(extra_body={"structured_outputs": {"disable_any_whitespace": True}}), "needs one of"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "needs json_schema.schema"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "not in tools"),
    (dict(tool_choice="required"), "needs tools"),
], ids=["schema", "regex", "grammar", "json-text", "two", "two-inside", "none", "no-schema", "unknown-tool",
        "no-tools"])
def test_invalid_constraints_are_400_naming_the_problem(client, kw, words):
    # catches: a bad spec accepted (and failing mid-generation, or never) or answered with a 500
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, **kw)
    assert words in err.value.message



def test_responses_text_format_and_a_named_tool_become_the_chat_constraints(client):
    """/v1/responses: text.format (flat json_schema) and a named tool_choice reach the chat request that runs."""
    from servers.openai.endpoints.responses_api.build import to_chat_request
    from servers.openai.endpoints.responses_api.protocol import ResponsesRequest

    chat_req = to_chat_request(ResponsesRequest(input="x", text={"format": {
        "type": "json_schema", "name": "weather", "schema": SCHEMA, "strict": True}}))
    assert chat_req.response_format.type == "json_schema" and chat_req.response_format.json_schema.schema_ == SCHEMA
    assert to_chat_request(ResponsesRequest(input="x", text={"format": {"type": "json_object"}})).response_format.type \
        == "json_object"
    tools = [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}]
    named = to_chat_request(ResponsesRequest(input="x", tools=tools, tool_choice={"type": "function",
                                                                               "name": "get_weather"}))
    assert named.tool_choice.function == {"name": "get_weather"}
    for bad in ({"format": {"type": "yaml"}}, {"format": {"type": "json_schema", "name": "n"}}):
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model=MODEL, input="x", max_output_tokens=4, text=bad)
