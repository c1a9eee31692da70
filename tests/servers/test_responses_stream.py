"""Streamed /v1/responses: deltas add up to the final items, which equal the non-streamed answer."""

from __future__ import annotations

import asyncio
import json

from server_cases import MEDIA, SMALL, data_url

from mm_infer.engine.outputs.request_output import CompletionOutput, OutputAccumulator, RequestOutput
from servers.openai.endpoints.responses_api.build import response_head, to_chat_request
from servers.openai.endpoints.responses_api.protocol import ResponsesRequest
from servers.openai.endpoints.responses_api.stream import response_events

MM = {"mm_processor_kwargs": {"max_pixels": SMALL}}


def _input() -> list[dict]:
    return [{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(MEDIA / "images" / "photo.png", "image/png")},
        {"type": "input_text", "text": "What is this?"}]}]


def test_stream_adds_up_to_the_non_streamed_response(client):
    kw = {"model": "m", "input": _input(), "max_output_tokens": 6, "temperature": 0.0, "extra_body": MM}
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[0].response.status == "in_progress"
    final = events[-1].response
    assert events[-1].type == f"response.{whole.status}" and final.status == whole.status
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text == whole.output_text
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == [e.item.id for e in events if e.type == "response.output_item.done"] == [i.id for i in final.output]
    for key in ("prompt_token_ids", "generation_token_ids"):
        assert final.output[-1].model_extra[key] == whole.output[-1].model_extra[key]
    assert final.model_extra["weight_version"] == whole.model_extra["weight_version"]


def _snapshot(text: str, ids: list[int], finish: str | None) -> RequestOutput:
    comp = CompletionOutput(index=0, text=text, token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason=finish)
    return RequestOutput("r", None, [1, 2, 3], [comp], finished=finish is not None)


class _Deltas:
    """What response_events reads of a Generation: its DELTA outputs, and the answer they add up to."""

    def __init__(self, outs: list[RequestOutput]) -> None:
        self.outs, self.streamed = outs, OutputAccumulator()

    async def stream(self):
        for out in self.outs:
            yield self.streamed.add(out)

    def whole(self) -> RequestOutput | None:
        return self.streamed.whole()


def _events(state, req: ResponsesRequest, texts: list[str], finish: str) -> list[dict]:
    deltas = _Deltas([_snapshot(text[len(texts[i - 1]) if i else 0:], [10 + i],  # what is new in each text
                                finish if i == len(texts) - 1 else None) for i, text in enumerate(texts)])

    async def collect() -> list[str]:
        chat = to_chat_request(req)
        return [e async for e in response_events(state, response_head(state, req, "resp_t", 0), chat, deltas)]

    return [json.loads(e.split("data: ", 1)[1]) for e in asyncio.run(collect())]


def test_reasoning_message_and_tool_call_stream_in_order(server):
    call = '<tool_call>{"name": "f", "arguments": {"q": 1}}</tool_call>'
    texts = ["<think>ab", "<think>abc</think>", "<think>abc</think>Hi", "<think>abc</think>Hi there<tool",
             f"<think>abc</think>Hi there{call}"]
    req = ResponsesRequest(input="x", tools=[{"type": "function", "name": "f"}])
    events = _events(server.state, req, texts, "stop")
    kinds = [e["type"] for e in events]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.content_part.added")
    added = [(e["output_index"], e["item"]["type"]) for e in events if e["type"] == "response.output_item.added"]
    assert added == [(0, "reasoning"), (1, "message"), (2, "function_call")]
    reasoning = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call"]
    assert reasoning == final["output"][0]["content"][0]["text"] == "abc"
    assert text == final["output"][1]["content"][0]["text"] == "Hi there"
    assert final["output"][2]["name"] == "f" and json.loads(final["output"][2]["arguments"]) == {"q": 1}
    assert final["output"][2]["generation_token_ids"] == list(range(10, 15))
    assert "generation_token_ids" not in final["output"][1]


def test_an_aborted_stream_ends_with_an_error_event(server):
    events = _events(server.state, ResponsesRequest(input="x"), ["a", "ab"], "abort")
    assert events[-1]["type"] == "error" and events[-1]["code"] == "503"
    assert not any(e["type"].startswith("response.completed") for e in events)
