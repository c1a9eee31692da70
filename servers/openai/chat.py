"""POST /v1/chat/completions: messages to a prompt, one engine request, answered whole or as SSE chunks."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from mm_infer.engine.outputs import CompletionOutput, RequestOutput
from mm_infer.engine.sampling import SamplingParams
from mm_infer.prompt import replace_prefix_tokens
from mm_infer.prompt.inputs import PromptInput
from servers.openai.admission import (
    MAX_TEMPLATE_CHARS,
    check_answer_size,
    check_rendered,
    check_sequences,
    check_text,
    clamp_lengths,
    message_texts,
    text_char_limit,
)
from servers.openai.json_out import compact, json_answer, sse
from servers.openai.messages import parse_messages
from servers.openai.outputs import (
    Parsed,
    ParsedToolCall,
    chat_logprobs,
    json_logprobs,
    prompt_logprobs,
    running_usage,
    usage,
)
from servers.openai.prompt_limits import check_media_counts, truncate_prompt, truncation_length
from servers.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    TextPart,
    Tool,
    check_tool_choice,
    to_sampling_params,
)
from servers.openai.replies import (
    ApiError,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatMessageOut,
    ChoiceLogprobs,
    DeltaMessage,
    FunctionCall,
    PromptMediaOut,
    ToolCallDelta,
    ToolCallOut,
    Usage,
    prompt_media,
)
from servers.openai.state import ServerState
from servers.openai.streaming import (
    ClosingStreamingResponse,
    Generation,
    generation_events,
    output_version,
    watch,
)
from servers.openai.structured import request_parser
from servers.openai.vllm_fields import template_kwargs


async def render_chat_text(state: ServerState, messages: list[dict[str, Any]], *, add_generation_prompt: bool,
                           continue_final_message: bool, chat_template_kwargs: dict[str, Any] | None,
                           tools: list[dict[str, Any]] | None, chat_template: str | None) -> str:
    """The rendered conversation: the checkpoint's template (or --chat-template) in this process; a template the
    request sent in a killable worker (state.templates: deadline, memory cap) on the pool's own threads. Either
    way capped at what the context can hold, and refused (400 naming the cap) before anyone tokenizes it."""
    tokenizer, renderer = state.preparer.tokenizer, state.preparer.renderer
    cap = text_char_limit(tokenizer, state.backend.max_model_len)
    options = {"add_generation_prompt": add_generation_prompt, "continue_final_message": continue_final_message,
               "chat_template_kwargs": chat_template_kwargs, "tools": tools}
    if chat_template is None or chat_template in (state.config.chat_template, tokenizer.chat_template):
        own = state.config.chat_template if chat_template is None else chat_template  # the server's: trusted
        text = await asyncio.to_thread(renderer.render_text, messages, chat_template=own, max_chars=cap, **options)
        param = "messages"
    else:
        context = renderer.template_context(messages, **options)
        text = renderer.finish_text(await state.templates.render_async(chat_template, messages, context, cap),
                                    messages, continue_final_message)
        param = "chat_template"
    check_rendered(tokenizer, state.backend.max_model_len, text, param)
    return text


def request_template(state: ServerState, chat_template: str | None,
                     chat_template_kwargs: dict[str, Any] | None) -> tuple[str | None, dict[str, Any] | None]:
    """The template the request sent (its chat_template, or one under chat_template_kwargs), else None; and the
    kwargs without it. Past MAX_TEMPLATE_CHARS it is a 400."""
    kwargs = dict(chat_template_kwargs or {})
    source = chat_template if chat_template is not None else kwargs.pop("chat_template", None)
    kwargs.pop("chat_template", None)
    if source is not None and not isinstance(source, str):
        raise ApiError(400, "chat_template must be a string", param="chat_template")
    if source is not None and len(source) > MAX_TEMPLATE_CHARS:
        raise ApiError(400, f"chat_template is {len(source)} characters, over the limit of {MAX_TEMPLATE_CHARS}",
                       param="chat_template")
    return source, (kwargs if chat_template_kwargs is not None else None)


async def build_chat_prompt(state: ServerState, messages: list[ChatMessage], *, add_generation_prompt: bool,
                            continue_final_message: bool, chat_template_kwargs: dict[str, Any] | None,
                            mm_processor_kwargs: dict[str, Any] | None,
                            tools: list[Tool] | None, chat_template: str | None = None,
                            add_special_tokens: bool = False, cache_salt: str | None = None,
                            media_io_kwargs: dict[str, Any] | None = None) -> PromptInput:
    """The typed prompt: token ids (earlier turns' exact ids spliced in) plus processed media items; the
    request's chat_template, else the server's, else the checkpoint's."""
    max_model_len = state.backend.max_model_len
    check_text(state.preparer.tokenizer, max_model_len, message_texts(messages), "messages")
    chat = parse_messages(messages)
    check_media_counts((ref.kind for ref in chat.media), state.config.limit_mm_per_prompt)
    opts = state.media.options(mm_processor_kwargs, media_io_kwargs)
    tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
    source, chat_template_kwargs = request_template(state, chat_template, chat_template_kwargs)
    renderer = state.preparer.renderer

    async def template_ids() -> list[int]:
        text = await render_chat_text(state, chat.messages, add_generation_prompt=add_generation_prompt,
                                      continue_final_message=continue_final_message,
                                      chat_template_kwargs=chat_template_kwargs, tools=tool_dicts,
                                      chat_template=source)
        if chat.carried is None:
            return await asyncio.to_thread(renderer.encode, text, add_special_tokens)
        if bad := [t for t in chat.carried.token_ids if not 0 <= t < state.backend.vocab_size]:
            raise ApiError(400, f"carried token ids outside the vocabulary: {bad[:5]}", param="messages")
        prefix = await render_chat_text(state, chat.messages[:chat.carried.message_index + 1],
                                        add_generation_prompt=False, continue_final_message=False,
                                        chat_template_kwargs=chat_template_kwargs, tools=tool_dicts,
                                        chat_template=source)

        def splice() -> list[int]:
            ids, prefix_ids = renderer.encode(text, add_special_tokens), renderer.encode(prefix, add_special_tokens)
            return replace_prefix_tokens(state.preparer.tokenizer, chat.carried.token_ids, prefix_ids, ids)

        return await asyncio.to_thread(splice)

    ids, items = await asyncio.gather(template_ids(), state.media.resolve(chat.media, opts))
    return PromptInput(token_ids=ids, images=[it for it in items if it.modality == "image"],
                       videos=[it for it in items if it.modality == "video"], cache_salt=cache_salt)


def parse_chat_output(state: ServerState, req: ChatCompletionRequest, text: str, final: bool) -> Parsed:
    """The answer text as content, reasoning and tool calls (a forced tool_choice parses without --tool-parser)."""
    use_tools = bool(req.tools) and req.tool_choice != "none"
    parser = request_parser(state.parser, req)
    return parser.parse(text, final, use_tools) if parser.active else Parsed(text)


def _finish(comp: CompletionOutput, parsed: Parsed) -> str | None:
    return "tool_calls" if parsed.tool_calls and comp.finish_reason == "stop" else comp.finish_reason


def echo_text(req: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the last message's text when it has the answer's role (assistant, or the last message's
    own role without a generation prompt), prepended to each answer."""
    last = req.messages[-1]
    if not req.echo or not last.content or last.role != ("assistant" if req.add_generation_prompt else last.role):
        return ""
    if isinstance(last.content, str):
        return last.content
    return "\n".join(p.text for p in last.content if isinstance(p, TextPart))


def _calls(req: ChatCompletionRequest, parsed: Parsed) -> list[ParsedToolCall]:
    return parsed.tool_calls if req.parallel_tool_calls is not False else parsed.tool_calls[:1]


def _choice(state: ServerState, req: ChatCompletionRequest, out: RequestOutput, comp: CompletionOutput) -> ChatChoice:
    parsed = parse_chat_output(state, req, comp.text, True)
    reasoning = parsed.reasoning_content if req.include_reasoning else None
    content = parsed.content if parsed.content or not parsed.tool_calls else None
    echo = echo_text(req)
    message = ChatMessageOut(
        content=echo + (content or "") if echo else content, reasoning=reasoning, reasoning_content=reasoning,
        tool_calls=[ToolCallOut(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
                    for c in _calls(req, parsed)],
        prompt_token_ids=list(out.prompt_token_ids), generation_token_ids=list(comp.token_ids),
        generation_log_probs=json_logprobs(comp.logprobs))
    logprobs = None
    if req.logprobs:
        logprobs = ChoiceLogprobs(content=chat_logprobs(state.preparer.tokenizer, comp, 0, req.top_logprobs or 0,
                                                        req.return_tokens_as_token_ids))
    return ChatChoice(index=comp.index, message=message, logprobs=logprobs, finish_reason=_finish(comp, parsed),
                      stop_reason=comp.stop_reason, token_ids=list(comp.token_ids) if req.return_token_ids else None)


def chat_response(state: ServerState, req: ChatCompletionRequest, out: RequestOutput, rid: str,
                  created: int, weight_version: int | None = None,
                  media: list[PromptMediaOut] | None = None) -> ChatCompletionResponse:
    return ChatCompletionResponse(
        id=rid, created=created, model=state.config.model_name,
        choices=[_choice(state, req, out, c) for c in out.outputs], usage=usage(out),
        prompt_token_ids=list(out.prompt_token_ids) if req.return_token_ids else None,
        prompt_media=media if req.return_token_ids else None,
        prompt_logprobs=prompt_logprobs(state.preparer.tokenizer, out, req.return_tokens_as_token_ids)
        if req.prompt_logprobs is not None else None,
        weight_version=state.backend.weight_version if weight_version is None else weight_version)


class _Sent:
    """What one choice has streamed so far (its raw text only when a parser must see all of it)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.raw: list[str] = []
        self.content = ""
        self.reasoning = ""
        self.done = False


def _delta(state: ServerState, req: ChatCompletionRequest, comp: CompletionOutput, sent: _Sent) -> dict[str, Any]:
    """A chunk choice from one DELTA output: its new text (through the reasoning/tool parsers when configured), as
    the None-free dict ChatChunkChoice's SSE encoding would be (built directly: this runs once per token)."""
    final = comp.finish_reason is not None
    parsed = Parsed(comp.text)
    content, reasoning = comp.text, ""
    if request_parser(state.parser, req).active:  # the parsers read the whole text: markup may span deltas
        sent.raw.append(comp.text)
        parsed = parse_chat_output(state, req, "".join(sent.raw), final)
        content = parsed.content[len(sent.content):] if parsed.content.startswith(sent.content) else ""
        reasoning_now = parsed.reasoning_content or ""
        reasoning = reasoning_now[len(sent.reasoning):] if reasoning_now.startswith(sent.reasoning) else ""
        sent.content += content
        sent.reasoning += reasoning
    logprobs = None
    if req.logprobs:
        logprobs = ChoiceLogprobs(content=chat_logprobs(state.preparer.tokenizer, comp, 0, req.top_logprobs or 0,
                                                        req.return_tokens_as_token_ids))
    sent.tokens += len(comp.token_ids)
    calls = [ToolCallDelta(index=i, id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
             for i, c in enumerate(_calls(req, parsed))] if final and parsed.tool_calls else None
    sent.done = final
    reasoning = reasoning if req.include_reasoning else ""
    delta = compact(content=content or None, reasoning=reasoning or None, reasoning_content=reasoning or None,
                    tool_calls=calls)
    return compact(index=comp.index, delta=delta, logprobs=logprobs, finish_reason=_finish(comp, parsed) if final
                   else None, stop_reason=comp.stop_reason if final else None,
                   token_ids=list(comp.token_ids) if req.return_token_ids else None)


async def _chunks(state: ServerState, req: ChatCompletionRequest, gen: Generation, rid: str,
                  created: int, media: list[PromptMediaOut] | None) -> AsyncIterator[bytes | str]:
    def head(out: RequestOutput | None = None) -> dict:
        return {"id": rid, "created": created, "model": state.config.model_name,
                "weight_version": output_version(state, out)}

    sent = [_Sent() for _ in range(req.n)]
    assert gen.first is not None
    so_far = running_usage(req.stream_options, len(gen.first.prompt_token_ids))
    for i in range(req.n):
        yield sse(ChatCompletionChunk(**head(), choices=[
            ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=echo_text(req)))],
            prompt_token_ids=list(gen.first.prompt_token_ids) if req.return_token_ids and i == 0 else None,
            prompt_media=media if req.return_token_ids and i == 0 else None, usage=so_far(0)))

    def event(_: int, out: RequestOutput) -> bytes | None:
        choices = [_delta(state, req, c, sent[c.index]) for c in out.outputs
                   if not sent[c.index].done and (c.token_ids or c.text or c.finish_reason)]
        if not choices:
            return None
        return sse(compact(id=rid, object="chat.completion.chunk", created=created, model=state.config.model_name,
                           choices=choices, usage=so_far(sum(s.tokens for s in sent)),
                           weight_version=output_version(state, out)))

    def usage_chunk(total: Usage) -> bytes | str:
        return sse(ChatCompletionChunk(**head(gen.whole()), choices=[], usage=total))

    async for text in generation_events(gen, event, usage_chunk, req.stream_options):
        yield text


async def chat_request_prompt(state: ServerState, req: ChatCompletionRequest) -> tuple[SamplingParams, PromptInput]:
    """A chat request's SamplingParams and (truncated) prompt: what the chat and render endpoints both start from."""
    check_tool_choice(req)
    params = to_sampling_params(req, state.backend.vocab_size, state.sampling_defaults)
    check_sequences(1, req.n, state.config.max_sequences_per_request)
    max_model_len, limit = state.backend.max_model_len, state.config.max_logprob_entries
    params = clamp_lengths(params, max_model_len)
    check_answer_size(params, max_model_len, limit, [None], param=_logprobs_param(params))
    prompt = await build_chat_prompt(
        state, req.messages, add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message, chat_template_kwargs=template_kwargs(req),
        mm_processor_kwargs=req.mm_processor_kwargs, tools=req.tools if req.tool_choice != "none" else None,
        chat_template=req.chat_template, add_special_tokens=req.add_special_tokens, cache_salt=req.cache_salt,
        media_io_kwargs=req.media_io_kwargs)
    prompt = truncate_prompt(prompt, truncation_length(req.truncate_prompt_tokens, state.backend.max_model_len),
                             state.preparer.placeholder_ids, state.preparer.merge_size)
    check_answer_size(params, max_model_len, limit, [expanded_length(prompt, state.preparer.merge_size)],
                      param=_logprobs_param(params))
    return params, prompt


def _logprobs_param(params: SamplingParams) -> str:
    return "top_logprobs" if params.logprobs is not None else "prompt_logprobs"


def expanded_length(prompt: PromptInput, merge_size: int) -> int:
    """The prompt's length once each media placeholder is expanded to its t*h*w/merge² tokens."""
    items = [*prompt.images, *prompt.videos]
    return len(prompt.token_ids or ()) + sum(t * h * w // merge_size ** 2 - 1 for t, h, w in
                                             (it.grid_thw for it in items))


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest, request: Request):
    params, prompt = await chat_request_prompt(state, req)
    rid = f"chatcmpl-{req.request_id or uuid.uuid4().hex}"
    created = int(time.time())
    gen = Generation(state, prompt, params, rid, req.affinity_key, req.stream)
    media = prompt_media(prompt.images, prompt.videos) if req.return_token_ids else None  # asked for only
    if req.stream:
        await watch(gen.start(), request.is_disconnected)
        return ClosingStreamingResponse(_chunks(state, req, gen, rid, created, media),
                                        media_type="text/event-stream")
    out = await gen.final(request.is_disconnected)
    items = len(out.prompt_token_ids) * (1 + (req.prompt_logprobs or 0)) + sum(
        len(c.token_ids) for c in out.outputs) * (1 + (req.top_logprobs or 0))
    return await json_answer(lambda: chat_response(state, req, out, rid, created, gen.weight_version, media), items)
