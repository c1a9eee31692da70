"""Streamed /v1/responses: typed SSE events, text deltas while generating, whole items (with the ids) at the end."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from pydantic import BaseModel

from mm_infer.engine.outputs.request_output import RequestOutput
from servers.openai.answers.parsers import Delta, OutputStream
from servers.openai.answers.streaming import Generation, aborted_error, output_version
from servers.openai.bodies.errors import from_exception
from servers.openai.bodies.requests import ChatCompletionRequest
from servers.openai.endpoints.chat import chat_stream, prompt_opens_reasoning
from servers.openai.endpoints.responses_api.build import ItemIds, finish_response
from servers.openai.endpoints.responses_api.objects import OutputMessage, OutputReasoning, ResponseObject
from servers.openai.state import ServerState
from servers.openai.web.json_encoding import named_sse


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(exclude_none=True)


class _Events:
    """Numbered SSE events (`sequence_number` counts from 0)."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return named_sse(kind, body)


class _Progress:
    """What has been announced so far: reasoning deltas first, then the message's text deltas."""

    def __init__(self, ev: _Events, ids: ItemIds) -> None:
        self.ev = ev
        self.ids = ids
        self.reasoning = ""
        self.text = ""
        self.index: dict[str, int] = {}  # item kind -> announced output_index
        self.reasoning_done = False

    def _announce(self, kind: str, item: dict[str, Any]) -> Iterator[str]:
        self.index[kind] = len(self.index)
        yield self.ev("response.output_item.added", output_index=self.index[kind], item=item)

    def _at(self, item_id: str, kind: str) -> dict[str, Any]:
        return {"item_id": item_id, "output_index": self.index[kind], "content_index": 0}

    def advance(self, piece: Delta) -> Iterator[str]:
        """Events for one piece of parsed text: reasoning deltas (announcing the item), then message text deltas
        (closing the reasoning and announcing the message first)."""
        if piece.reasoning and "message" not in self.index:
            if "reasoning" not in self.index:
                yield from self._announce("reasoning", {"type": "reasoning", "id": self.ids.reasoning, "summary": [],
                                                        "content": [], "status": "in_progress"})
            yield self.ev("response.reasoning_text.delta", **self._at(self.ids.reasoning, "reasoning"),
                          delta=piece.reasoning)
            self.reasoning += piece.reasoning
        if piece.content:
            if "message" not in self.index:
                if "reasoning" in self.index:
                    yield from self.close_reasoning(OutputReasoning(
                        id=self.ids.reasoning, content=[{"type": "reasoning_text", "text": self.reasoning}],
                        status="completed"))
                self.ids.message_announced = True
                yield from self._announce("message", {"type": "message", "id": self.ids.message,
                                                      "role": "assistant", "status": "in_progress", "content": []})
                yield self.ev("response.content_part.added", **self._at(self.ids.message, "message"),
                              part={"type": "output_text", "text": "", "annotations": []})
            yield self.ev("response.output_text.delta", **self._at(self.ids.message, "message"),
                          delta=piece.content, logprobs=[])
            self.text += piece.content

    def close_reasoning(self, item: OutputReasoning) -> Iterator[str]:
        self.reasoning_done = True
        yield self.ev("response.reasoning_text.done", **self._at(item.id, "reasoning"), text=item.content[0].text)
        yield self.ev("response.output_item.done", output_index=self.index["reasoning"], item=_dump(item))

    def finish(self, final: ResponseObject) -> Iterator[str]:
        """Done events for every item of the finished response, announcing those not yet announced."""
        for item in final.output:
            if isinstance(item, OutputReasoning):
                if self.reasoning_done:
                    continue
                if "reasoning" not in self.index:
                    yield from self._announce("reasoning", {**_dump(item), "content": [], "status": "in_progress"})
                text = item.content[0].text
                if rest := text[len(self.reasoning):] if text.startswith(self.reasoning) else "":
                    yield self.ev("response.reasoning_text.delta", **self._at(item.id, "reasoning"), delta=rest)
                yield from self.close_reasoning(item)
            elif isinstance(item, OutputMessage):
                at = self._at(item.id, "message") if "message" in self.index else None
                if at is None:
                    yield from self._announce("message", {**_dump(item), "content": [], "status": "in_progress"})
                    at = self._at(item.id, "message")
                    yield self.ev("response.content_part.added", **at,
                                  part={"type": "output_text", "text": "", "annotations": []})
                text = item.content[0].text
                if rest := text[len(self.text):] if text.startswith(self.text) else "":
                    yield self.ev("response.output_text.delta", **at, delta=rest, logprobs=[])
                part = _dump(item.content[0])
                yield self.ev("response.output_text.done", **at, text=item.content[0].text,
                              logprobs=part.get("logprobs", []))
                yield self.ev("response.content_part.done", **at, part=part)
                yield self.ev("response.output_item.done", output_index=at["output_index"], item=_dump(item))
            else:
                kind = f"call:{item.call_id}"
                yield from self._announce(kind, {**_dump(item), "arguments": "", "status": "in_progress"})
                yield self.ev("response.function_call_arguments.done", item_id=item.id,
                              output_index=self.index[kind], arguments=item.arguments)
                yield self.ev("response.output_item.done", output_index=self.index[kind], item=_dump(item))


async def response_events(state: ServerState, head: ResponseObject, chat: ChatCompletionRequest,
                          gen: Generation) -> AsyncIterator[str]:
    """created, in_progress, item / delta events, then completed (or incomplete); an error event on failure."""
    ev = _Events()
    progress = _Progress(ev, ItemIds())
    yield ev("response.created", response=_dump(head))
    yield ev("response.in_progress", response=_dump(head))
    final: RequestOutput | None = None
    version = state.backend.weight_version
    parser: OutputStream | None = None  # made on the first output (its prompt says whether reasoning is open)
    deltas = gen.stream()  # one sample's new text each time; gen.whole() assembles the answer once
    try:
        async for out in deltas:
            comp = out.outputs[0]
            if parser is None:
                parser = chat_stream(state, chat, prompt_opens_reasoning(state, chat, out.prompt_token_ids))
            if comp.finish_reason == "abort":
                err = aborted_error()
                yield ev("error", code=str(err.status), message=err.message, param=None)
                return
            if comp.finish_reason is not None:
                final, version = gen.whole(), output_version(state, out)  # in flight: no refit can have run yet
                break
            for event in progress.advance(parser.feed(comp.text) if parser else Delta(content=comp.text)):
                yield event
    except Exception as exc:  # an abort by pause or an engine failure becomes an error event
        err = from_exception(exc)
        yield ev("error", code=str(err.status), message=err.message, param=err.param)
        return
    finally:
        await deltas.aclose()  # type: ignore[attr-defined]
    if final is None:
        return
    response = finish_response(state, head, chat, final, progress.ids, version)
    for event in progress.finish(response):
        yield event
    kind = "response.completed" if response.status == "completed" else "response.incomplete"
    yield ev(kind, response=_dump(response))
