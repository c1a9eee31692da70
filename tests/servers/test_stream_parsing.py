"""Streamed chat deltas through the parsers: reasoning and content split, tool calls once complete."""

from __future__ import annotations

import json
from types import SimpleNamespace

from mm_infer.engine.outputs.request_output import CompletionOutput
from servers.openai.answers.parsers import build_output_parser
from servers.openai.bodies.replies import ChatChunkChoice
from servers.openai.bodies.requests import ChatCompletionRequest
from servers.openai.endpoints.chat import _delta, _Sent

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
SNAPSHOTS = ["<think>The us", "<think>The user wants</th", "<think>The user wants</think>Let me", "<think>The user "
             "wants</think>Let me look.<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
             "<think>The user wants</think>Let me look.<tool_call>{\"name\": \"get_weather\", \"arguments\": "
             "{\"city\": \"Oslo\"}}</tool_call>"]


def _run(tools: list | None) -> list:
    state = SimpleNamespace(parser=build_output_parser("think", "hermes"))
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "weather?"}], tools=tools)
    sent = _Sent()
    chunks = []
    for i, text in enumerate(SNAPSHOTS):  # the engine sends DELTA outputs: what is new in each snapshot
        final = i == len(SNAPSHOTS) - 1
        new = text[len(SNAPSHOTS[i - 1]) if i else 0:]
        comp = CompletionOutput(0, new, [i], [0.0], "stop" if final else None)
        chunks.append(ChatChunkChoice.model_validate(_delta(state, req, comp, sent)))  # a dict: the model's fields
    return chunks


def test_reasoning_and_content_stream_apart_and_tool_calls_come_last():
    chunks = _run(TOOLS)
    reasoning = "".join(c.delta.reasoning or "" for c in chunks)
    content = "".join(c.delta.content or "" for c in chunks)
    assert reasoning == "The user wants"
    assert content == "Let me look."
    assert all(c.delta.tool_calls is None for c in chunks[:-1])
    (call,) = chunks[-1].delta.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}
    assert chunks[-1].finish_reason == "tool_calls"
    assert not any("<" in (c.delta.content or "") + (c.delta.reasoning or "") for c in chunks)


def test_without_tools_the_markup_stays_content():
    chunks = _run(None)
    content = "".join(c.delta.content or "" for c in chunks)
    assert content.startswith("Let me look.<tool_call>") and chunks[-1].finish_reason == "stop"
