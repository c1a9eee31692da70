"""orjson SSE events and whole answers: the same JSON as the pydantic models they replace, large ones off the loop."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from fastapi.encoders import jsonable_encoder

from servers.openai.bodies.replies import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatMessageOut,
    ChoiceLogprobs,
    CompletionLogprobs,
    CompletionResponse,
    FunctionCall,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from servers.openai.web import json_encoding as json_out
from servers.openai.web.json_encoding import JsonBody, compact, json_answer, sse

LOGPROBS = ChoiceLogprobs(content=[TokenLogprob(token="é", logprob=-0.25, top_logprobs=[TopLogprob(token="a",
                                                                                                   logprob=-9999.0)])])
CHOICES = [
    compact(index=0, delta=compact(content="héllo ✓")),
    compact(index=1, delta={}, finish_reason="length"),
    compact(index=0, delta=compact(content="x", reasoning="r", reasoning_content="r"), logprobs=LOGPROBS,
            finish_reason="stop", stop_reason=7, token_ids=[1, 2]),
    compact(index=0, delta=compact(tool_calls=[ToolCallDelta(index=0, id="c1", function=FunctionCall(
        name="f", arguments='{"a": 1}'))]), finish_reason="tool_calls", stop_reason="</s>"),
]


@pytest.mark.parametrize("choice", CHOICES)
@pytest.mark.parametrize("usage", [None, Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4)])
def test_a_dict_event_is_the_bytes_the_model_would_send(choice, usage):
    event = compact(id="chatcmpl-1", object="chat.completion.chunk", created=5, model="m", choices=[choice],
                    usage=usage, weight_version=2)
    as_model = ChatCompletionChunk.model_validate({**event, "usage": usage})
    assert sse(event) == sse(as_model) == f"data: {as_model.model_dump_json(exclude_none=True)}\n\n".encode()
    assert b"null" not in sse(event)


def test_an_unknown_object_in_an_event_is_a_type_error():
    with pytest.raises(TypeError, match="not JSON serializable"):
        sse({"x": object()})


def _answer() -> ChatCompletionResponse:
    return ChatCompletionResponse(id="chatcmpl-1", created=5, model="m", usage=Usage(
        prompt_tokens=1, completion_tokens=1, total_tokens=2, prompt_tokens_details={"cached_tokens": 0}),
        choices=[ChatChoice(index=0, message=ChatMessageOut(content="ü", generation_log_probs=[-1e-05]),
                            finish_reason="stop", logprobs=LOGPROBS)])


def test_a_whole_answer_is_what_fastapi_would_have_sent():
    fastapi_body = json.dumps(jsonable_encoder(_answer()), ensure_ascii=False, separators=(",", ":"))
    body = JsonBody(_answer()).body
    assert json.loads(body) == json.loads(fastapi_body) and list(json.loads(body)) == list(json.loads(fastapi_body))
    assert JsonBody(b'{"a":1}').body == b'{"a":1}' and JsonBody({"a": None}).body == b'{"a":null}'
    assert JsonBody(_answer()).headers["content-type"] == "application/json"


@pytest.mark.parametrize("items, off_loop", [(10, False), (json_out.OFF_LOOP_ITEMS + 1, True)])
def test_large_answers_are_built_off_the_loop(items, off_loop):
    where: list[int] = []

    def build() -> ChatCompletionResponse:
        where.append(threading.get_ident())
        return _answer()

    async def main() -> bytes:
        return (await json_answer(build, items)).body

    loop_thread = threading.get_ident()  # asyncio.run runs the loop on this thread
    assert json.loads(asyncio.run(main()))["choices"][0]["message"]["content"] == "ü"
    assert (where[0] != loop_thread) == off_loop


@pytest.mark.parametrize("choice", [
    compact(index=0, text="hé", finish_reason=None),
    compact(index=3, text="", logprobs=CompletionLogprobs(tokens=["a", "b"], token_logprobs=[None, -0.5],
                                                          top_logprobs=[None, {"b": -0.5}], text_offset=[0, 1]),
            finish_reason="stop", stop_reason=2, token_ids=[4]),
])
def test_a_dict_completion_chunk_is_the_bytes_the_model_would_send(choice):
    event = compact(id="cmpl-1", object="text_completion", created=5, model="m", choices=[choice], weight_version=0)
    as_model = CompletionResponse.model_validate({**event, "choices": [{"finish_reason": None, **choice}],
                                                  "system_fingerprint": None})  # a chunk before the last has none
    assert sse(event) == sse(as_model) and (b"null" in sse(event)) == ("logprobs" in choice)  # list items stay
