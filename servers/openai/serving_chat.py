"""POST /v1/chat/completions: one engine request, answered whole or as SSE chunks, with the RL token fields."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from mm_infer.engine.outputs import CompletionOutput, RequestOutput
from servers.openai.chat_prompt import build_chat_prompt
from servers.openai.errors import from_exception
from servers.openai.generation import ClosingStreamingResponse, Generation, output_version, watch
from servers.openai.parsers import Parsed
from servers.openai.protocol import ChatCompletionRequest
from servers.openai.responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatMessageOut,
    ChoiceLogprobs,
    DeltaMessage,
    FunctionCall,
    ToolCallDelta,
    ToolCallOut,
)
from servers.openai.sampling import check_tool_choice, to_sampling_params
from servers.openai.state import ServerState
from servers.openai.stream_text import sse_error, visible_text
from servers.openai.token_fields import chat_logprobs, prompt_logprobs, usage


def _parse(state: ServerState, req: ChatCompletionRequest, text: str, final: bool) -> Parsed:
    use_tools = bool(req.tools) and req.tool_choice != "none"
    return state.parser.parse(text, final, use_tools) if state.parser.active else Parsed(text)


def _finish(comp: CompletionOutput, parsed: Parsed) -> str | None:
    return "tool_calls" if parsed.tool_calls and comp.finish_reason == "stop" else comp.finish_reason


def _choice(state: ServerState, req: ChatCompletionRequest, out: RequestOutput, comp: CompletionOutput) -> ChatChoice:
    parsed = _parse(state, req, comp.text, True)
    message = ChatMessageOut(
        content=parsed.content if parsed.content or not parsed.tool_calls else None,
        reasoning_content=parsed.reasoning_content,
        tool_calls=[ToolCallOut(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
                    for c in parsed.tool_calls],
        prompt_token_ids=list(out.prompt_token_ids), generation_token_ids=list(comp.token_ids),
        generation_log_probs=list(comp.logprobs))
    logprobs = None
    if req.logprobs:
        logprobs = ChoiceLogprobs(content=chat_logprobs(state, comp, 0, req.top_logprobs or 0,
                                                        req.return_tokens_as_token_ids))
    return ChatChoice(index=comp.index, message=message, logprobs=logprobs, finish_reason=_finish(comp, parsed),
                      stop_reason=comp.stop_reason, token_ids=list(comp.token_ids) if req.return_token_ids else None)


def chat_response(state: ServerState, req: ChatCompletionRequest, out: RequestOutput, rid: str,
                  created: int, weight_version: int | None = None) -> ChatCompletionResponse:
    return ChatCompletionResponse(
        id=rid, created=created, model=state.config.model_name,
        choices=[_choice(state, req, out, c) for c in out.outputs], usage=usage(out),
        prompt_token_ids=list(out.prompt_token_ids) if req.return_token_ids else None,
        prompt_logprobs=prompt_logprobs(state, out, req.return_tokens_as_token_ids)
        if req.prompt_logprobs is not None else None,
        weight_version=state.weight_version if weight_version is None else weight_version)


class _Sent:
    """What one choice has streamed so far."""

    def __init__(self) -> None:
        self.tokens = 0
        self.content = ""
        self.reasoning = ""
        self.done = False


def _delta(state: ServerState, req: ChatCompletionRequest, comp: CompletionOutput, sent: _Sent) -> ChatChunkChoice:
    final = comp.finish_reason is not None
    text = visible_text(comp.text, final, req.stop)
    parsed = _parse(state, req, text, final)
    content = parsed.content[len(sent.content):] if parsed.content.startswith(sent.content) else ""
    reasoning_now = parsed.reasoning_content or ""
    reasoning = reasoning_now[len(sent.reasoning):] if reasoning_now.startswith(sent.reasoning) else ""
    sent.content += content
    sent.reasoning += reasoning
    logprobs = None
    if req.logprobs:
        logprobs = ChoiceLogprobs(content=chat_logprobs(state, comp, sent.tokens, req.top_logprobs or 0,
                                                        req.return_tokens_as_token_ids))
    token_ids = list(comp.token_ids[sent.tokens:]) if req.return_token_ids else None
    sent.tokens = len(comp.token_ids)
    calls = [ToolCallDelta(index=i, id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
             for i, c in enumerate(parsed.tool_calls)] if final and parsed.tool_calls else None
    sent.done = final
    return ChatChunkChoice(index=comp.index, delta=DeltaMessage(content=content or None, reasoning_content=reasoning
                                                                or None, tool_calls=calls), logprobs=logprobs,
                           finish_reason=_finish(comp, parsed) if final else None,
                           stop_reason=comp.stop_reason if final else None, token_ids=token_ids)


def _sse(chunk: ChatCompletionChunk) -> str:
    return f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"


async def _chunks(state: ServerState, req: ChatCompletionRequest, gen: Generation, rid: str,
                  created: int) -> AsyncIterator[str]:
    def head(out: RequestOutput | None = None) -> dict:
        return {"id": rid, "created": created, "model": state.config.model_name,
                "weight_version": output_version(state, out)}

    sent = [_Sent() for _ in range(req.n)]
    last: RequestOutput | None = None
    stream = gen.stream()
    try:
        for i in range(req.n):
            yield _sse(ChatCompletionChunk(**head(), choices=[
                ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))],
                prompt_token_ids=list(gen.first.prompt_token_ids) if req.return_token_ids and i == 0 else None))
        async for out in stream:
            last = out
            if any(c.finish_reason == "abort" for c in out.outputs):
                yield sse_error(503, "the request was aborted before it finished", type="aborted")
                break
            choices = [_delta(state, req, c, sent[c.index]) for c in out.outputs
                       if not sent[c.index].done and (len(c.token_ids) > sent[c.index].tokens or c.finish_reason)]
            if choices:
                yield _sse(ChatCompletionChunk(**head(out), choices=choices))
    except Exception as exc:  # an engine failure mid-stream becomes an error event, not a cut connection
        err = from_exception(exc)
        yield sse_error(err.status, err.message, type=err.type)
    finally:
        await stream.aclose()
        await gen.aclose(last)
    if last is not None and req.stream_options is not None and req.stream_options.include_usage and last.finished:
        yield _sse(ChatCompletionChunk(**head(last), choices=[], usage=usage(last)))
    yield "data: [DONE]\n\n"


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest, request: Request):
    check_tool_choice(req)
    params = to_sampling_params(req, state.vocab_size)
    prompt = await build_chat_prompt(
        state, req.messages, add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message, chat_template_kwargs=req.chat_template_kwargs,
        mm_processor_kwargs=req.mm_processor_kwargs, tools=req.tools if req.tool_choice != "none" else None)
    rid = f"chatcmpl-{req.request_id or uuid.uuid4().hex}"
    created = int(time.time())
    gen = Generation(state, prompt, params, rid, req.affinity_key, req.stream)
    if req.stream:
        await watch(gen.start(), request.is_disconnected)
        return ClosingStreamingResponse(_chunks(state, req, gen, rid, created), media_type="text/event-stream")
    out = await gen.final(request.is_disconnected)
    return chat_response(state, req, out, rid, created, gen.weight_version)
