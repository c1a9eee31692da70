"""Responses items -> chat messages: each assistant turn's token ids stay with that turn; output item layout."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from mm_infer.engine.outputs.request_output import CompletionOutput
from servers.openai.answers.parsers import Parsed, ParsedToolCall
from servers.openai.bodies.errors import ApiError
from servers.openai.endpoints.responses_api.build import output_items
from servers.openai.endpoints.responses_api.inputs import to_chat_messages
from servers.openai.endpoints.responses_api.protocol import InputItem
from servers.openai.prompting.messages import parse_messages

ITEMS = TypeAdapter(list[InputItem])
A = {"prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.1, -0.2]}
B = {"prompt_token_ids": [1, 2, 3, 4, 5], "generation_token_ids": [6], "generation_log_probs": [-0.3]}


def convert(items: list[dict], instructions: str | None = None):
    return to_chat_messages(ITEMS.validate_python(items), instructions)


def user(text: str) -> dict:
    return {"role": "user", "content": [{"type": "input_text", "text": text}]}


def said(text: str, **ids) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}], **ids}


def test_string_input_and_instructions():
    msgs = convert([user("hi")], "be brief")
    assert [m.role for m in msgs] == ["system", "user"] and msgs[0].content == "be brief"
    assert [m.role for m in to_chat_messages("hello", None)] == ["user"]


def test_turn_ids_are_consumed_when_the_turn_is_flushed():
    msgs = convert([user("a"), said("x", **A), user("b"), said("y"), user("c")])
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[1].prompt_token_ids == [1, 2] and msgs[1].generation_token_ids == [3, 4]
    assert msgs[3].prompt_token_ids is None and msgs[3].generation_token_ids is None
    assert parse_messages(msgs).carried.message_index == 1


def test_a_later_assistant_message_never_inherits_ids():
    msgs = convert([user("a"), said("x", **A), said("y")])
    assert [m.role for m in msgs] == ["user", "assistant", "assistant"]
    assert msgs[1].generation_token_ids == [3, 4] and msgs[2].generation_token_ids is None
    msgs = convert([user("a"), said("x", **A), user("b"), said("y", **B), user("c")])
    assert parse_messages(msgs).carried.token_ids == [1, 2, 3, 4, 5, 6]  # the latest turn, its own ids only


def test_reasoning_message_and_call_form_one_turn_with_the_ids_of_its_last_item():
    msgs = convert([user("a"), {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
                    said("x"), {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", **A},
                    {"type": "function_call_output", "call_id": "c1", "output": "42"}])
    assert [m.role for m in msgs] == ["user", "assistant", "tool"]
    turn = msgs[1]
    assert (turn.content, turn.reasoning_content, turn.tool_calls[0].function.name) == ("x", "think", "f")
    assert turn.generation_token_ids == [3, 4] and msgs[2].tool_call_id == "c1" and msgs[2].content == "42"


def test_an_assistant_item_with_ids_but_no_content_is_dropped_with_its_ids():
    msgs = convert([user("a"), said("", **A), user("b")])
    assert [m.role for m in msgs] == ["user", "user"]
    msgs = convert([user("a"), {"role": "assistant", "content": [], **A}, said("y"), user("b")])
    assert [m.role for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1].content == "y" and msgs[1].prompt_token_ids is None
    assert parse_messages(msgs).carried is None
    msgs = convert([user("a"), {"type": "reasoning", "summary": [], **A}, said("y"), user("b")])
    assert msgs[1].generation_token_ids is None


@pytest.mark.parametrize("items", [
    [{"role": "user", "content": "a", **A}],
    [user("a"), said("x", prompt_token_ids=[1])],
    [user("a"), said("x", generation_token_ids=[1])],
])
def test_misplaced_or_half_ids_are_rejected(items):
    with pytest.raises(ApiError) as info:
        convert(items)
    assert info.value.status == 400


def test_output_items_order_and_ids_on_the_last_only():
    comp = CompletionOutput(index=0, text="", token_ids=[7, 8], logprobs=[-1.0, -2.0], finish_reason="stop")
    call = ParsedToolCall("call_abc", "lookup", "{\"q\": 1}")
    items = output_items(Parsed("visible", "thoughts", [call]), comp, [1, 2, 3], None)
    assert [i.type for i in items] == ["reasoning", "message", "function_call"]
    assert [i.generation_token_ids for i in items] == [None, None, [7, 8]]
    assert items[-1].prompt_token_ids == [1, 2, 3] and items[-1].generation_log_probs == [-1.0, -2.0]
    assert items[2].call_id == "call_abc" and items[0].content[0].text == "thoughts"
    empty = output_items(Parsed(""), comp, [1], None)
    assert [i.type for i in empty] == ["message"] and empty[0].content[0].text == ""
    assert empty[0].generation_token_ids == [7, 8] and empty[0].status == "completed"
