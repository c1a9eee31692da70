"""POST /v1/chat/completions: messages to a prompt, one engine request, answered whole or as SSE chunks."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from fastapi import Request

from mm_infer.engine.outputs.request_output import CompletionOutput, RequestOutput
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.prompt.chat_prompt import ChatPrompt, TemplateOptions, ids_from_rendered, render_jobs, truncate_prompt
from mm_infer.prompt.content_format import text_parts_joined
from mm_infer.prompt.inputs import PromptInput, media_fields
from mm_infer.prompt.templating import developer_as_system
from servers.openai.answers.logprobs import (
    CONTEXT_TOKENS,
    chat_logprobs,
    json_logprobs,
    prompt_logprobs,
    running_usage,
    usage,
)
from servers.openai.answers.parsers import Delta, OutputStream, Parsed, ParsedToolCall, reasoning_tokens
from servers.openai.answers.routed_experts import encode_routed_experts
from servers.openai.answers.streaming import (
    ClosingStreamingResponse,
    Generation,
    generation_events,
    output_version,
    watch,
)
from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.replies import (
    SYSTEM_FINGERPRINT,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatMessageOut,
    ChoiceLogprobs,
    FunctionCall,
    PromptMediaOut,
    ToolCallDelta,
    ToolCallOut,
    Usage,
    prompt_media,
)
from servers.openai.bodies.requests import ChatCompletionRequest, ChatMessage, NamedToolChoice, TextPart, Tool
from servers.openai.bodies.sampling_params import check_tool_choice, to_sampling_params
from servers.openai.bodies.tool_grammar import ToolStrictLevel, forced_tools, request_parser
from servers.openai.bodies.vllm_fields import template_kwargs
from servers.openai.prompting.admission import (
    MAX_TEMPLATE_CHARS,
    check_answer_size,
    check_rendered,
    check_sequences,
    check_text,
    clamp_lengths,
    message_texts,
    text_char_limit,
)
from servers.openai.prompting.messages import parse_messages
from servers.openai.prompting.prompt_limits import check_media_counts, truncation_length
from servers.openai.state import ServerState
from servers.openai.web.json_encoding import compact, json_answer, sse


async def render_chat_text(state: ServerState, source: str | None, messages: Sequence[Mapping[str, Any]],
                           options: TemplateOptions) -> str:
    """The rendered conversation: the checkpoint's template (or --chat-template) in this process; a template the
    request sent (`source`) in a killable worker (state.templates: deadline, memory cap), awaited without holding
    a thread. Either way capped at what the context can hold, and refused (400 naming the cap) before anyone
    tokenizes it."""
    tokenizer, renderer = state.preparer.tokenizer, state.preparer.renderer
    cap = text_char_limit(tokenizer, state.backend.facts.max_model_len)
    if source is None or source in (state.config.chat_template, tokenizer.chat_template):
        own = state.config.chat_template if source is None else source  # the server's: trusted
        text = await asyncio.to_thread(renderer.render_text, messages, chat_template=own, max_chars=cap,
                                       **options.as_kwargs())
        param = "messages"
    else:
        messages = text_parts_joined(developer_as_system(messages, source), source,
                                     renderer.media_tokens)  # as the in-process renderer does (vLLM's rules)
        context = renderer.template_context(messages, **options.as_kwargs())
        text = renderer.finish_text(await state.templates.render_async(source, messages, context, cap), messages,
                                    options.continue_final_message)
        param = "chat_template"
    check_rendered(tokenizer, state.backend.facts.max_model_len, text, param)
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
    """The typed prompt: the library's chat ids (mm_infer/prompt/chat_prompt.py: rendered with the request's
    chat_template, else the server's, else the checkpoint's; earlier turns' exact ids spliced in) plus the media
    items fetched and processed here, under the server's caps, at the same time."""
    max_model_len = state.backend.facts.max_model_len
    check_text(state.preparer.tokenizer, max_model_len, message_texts(messages), "messages")
    parsed = parse_messages(messages, audio_refused_for=None if getattr(state.preparer, "audio_tower", False)
                            else state.config.model_name)
    check_media_counts((ref.kind for ref in parsed.media), state.config.limit_mm_per_prompt)
    opts = state.media.options(mm_processor_kwargs, media_io_kwargs)
    source, chat_template_kwargs = request_template(state, chat_template, chat_template_kwargs)
    if parsed.carried is not None and (
            bad := [t for t in parsed.carried.token_ids if not 0 <= t < state.backend.facts.vocab_size]):
        raise ApiError(400, f"carried token ids outside the vocabulary: {bad[:5]}", param="messages")
    options = TemplateOptions(add_generation_prompt, continue_final_message, chat_template_kwargs,
                              [t.model_dump(exclude_none=True) for t in tools] if tools else None)
    chat = ChatPrompt(parsed.messages, options, parsed.carried, add_special_tokens)
    async def template_ids() -> list[int]:  # the library's render jobs, rendered here (a sandbox for theirs)
        texts = [await render_chat_text(state, source, m, o) for m, o in render_jobs(chat)]
        return await asyncio.to_thread(ids_from_rendered, chat, state.preparer.renderer, texts)

    ids, items = await asyncio.gather(template_ids(), state.media.resolve(parsed.media, opts))
    return PromptInput(token_ids=ids, **media_fields(items), cache_salt=cache_salt)


def _use_tools(req: ChatCompletionRequest) -> bool:
    return bool(req.tools) and req.tool_choice != "none"


def chat_stream(state: ServerState, req: ChatCompletionRequest, opened: bool) -> OutputStream | None:
    """The request's incremental parser (a forced tool_choice parses without --tool-parser), or None when the
    text is all content; `opened`: the prompt left a reasoning section open."""
    parser = request_parser(state.parser, req)
    return parser.stream(opened, _use_tools(req), req.tools) if parser.active else None


def prompt_opens_reasoning(state: ServerState, req: ChatCompletionRequest, prompt_token_ids: list[int]) -> bool:
    """Whether the rendered prompt ends inside a reasoning section (a template that appends `<think>`)."""
    return request_parser(state.parser, req).opened_by(state.preparer.tokenizer, prompt_token_ids)


def _finish(req: ChatCompletionRequest, comp: CompletionOutput, called: bool) -> str | None:
    """vLLM's (and OpenAI's) reason: "tool_calls" when calls end a sample by stop, except for a named tool_choice,
    whose forced call ends with "stop"."""
    named = isinstance(req.tool_choice, NamedToolChoice)
    return "tool_calls" if called and comp.finish_reason == "stop" and not named else comp.finish_reason


def reasoning_usage(state: ServerState, req: ChatCompletionRequest, total: Usage,
                    parts: list[tuple[CompletionOutput, tuple[int, int | None] | None]]) -> Usage:
    """total with vLLM's completion_tokens_details.reasoning_tokens when a reasoning parser is on: each sample's
    tokens inside its reasoning section (`parts`: the sample and its reasoning's character range)."""
    if request_parser(state.parser, req).reasoning is None:
        return total
    count = sum(reasoning_tokens(state.preparer.tokenizer, c.token_ids, span, req.skip_special_tokens)
                for c, span in parts)
    return total.model_copy(update={"completion_tokens_details": {"reasoning_tokens": count}})


def echo_text(req: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the last message's text when it has the answer's role (assistant, or the last message's
    own role without a generation prompt), prepended to each answer."""
    last = req.messages[-1]
    if not req.echo or not last.content or last.role != ("assistant" if req.add_generation_prompt else last.role):
        return ""
    if isinstance(last.content, str):
        return last.content
    return "\n".join(p.text for p in last.content if isinstance(p, TextPart))


def _calls(req: ChatCompletionRequest, calls: list[ParsedToolCall], sent: int = 0) -> list[ParsedToolCall]:
    """The calls to send, `sent` already sent: all of them, or the first only when parallel_tool_calls is false."""
    return calls if req.parallel_tool_calls is not False else calls[:max(0, 1 - sent)]


def parse_with_span(state: ServerState, req: ChatCompletionRequest, text: str,
                    opened: bool) -> tuple[Parsed, tuple[int, int | None] | None]:
    """The whole answer through the request's incremental parser (fed at once), and its reasoning's char range."""
    stream = chat_stream(state, req, opened)
    if stream is None:
        return Parsed(text), None
    stream.feed(text, True)
    return stream.parsed(), stream.reasoning_span


def _choice(state: ServerState, req: ChatCompletionRequest, out: RequestOutput, comp: CompletionOutput,
            parsed: Parsed) -> ChatChoice:
    reasoning = parsed.reasoning_content if req.include_reasoning else None
    beside = parsed.tool_calls or parsed.reasoning_content is not None  # vLLM: no content (None) beside these
    content = parsed.content or (None if beside else parsed.content)
    if forced_tools(req) is not None:
        content = content or ""  # vLLM: a forced call's message always has content, empty when none
    echo = echo_text(req)
    calls = _calls(req, parsed.tool_calls)
    message = ChatMessageOut(
        content=echo + (content or "") if echo else content, reasoning=reasoning, reasoning_content=reasoning,
        tool_calls=[ToolCallOut(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls],
        prompt_token_ids=list(out.prompt_token_ids), generation_token_ids=list(comp.token_ids),
        generation_log_probs=json_logprobs(comp.logprobs))
    logprobs = None
    if req.logprobs:
        logprobs = ChoiceLogprobs(content=chat_logprobs(state.preparer.tokenizer, comp, 0, req.top_logprobs or 0,
                                                        req.return_tokens_as_token_ids))
    return ChatChoice(index=comp.index, message=message, logprobs=logprobs,
                      finish_reason=_finish(req, comp, bool(calls)), stop_reason=comp.stop_reason,
                      token_ids=list(comp.token_ids) if req.return_token_ids else None,
                      routed_experts=encode_routed_experts(comp.routed_experts))


def chat_response(state: ServerState, req: ChatCompletionRequest, out: RequestOutput, rid: str,
                  created: int, weight_version: int | None = None,
                  media: list[PromptMediaOut] | None = None) -> ChatCompletionResponse:
    opened = prompt_opens_reasoning(state, req, out.prompt_token_ids)
    wholes = [parse_with_span(state, req, c.text, opened) for c in out.outputs]
    return ChatCompletionResponse(
        id=rid, created=created, model=state.config.model_name,
        choices=[_choice(state, req, out, c, parsed) for c, (parsed, _) in zip(out.outputs, wholes, strict=True)],
        usage=reasoning_usage(state, req, usage(out), [(c, span) for c, (_, span) in
                                                      zip(out.outputs, wholes, strict=True)]),
        prompt_token_ids=list(out.prompt_token_ids) if req.return_token_ids else None,
        prompt_media=media if req.return_token_ids else None,
        prompt_logprobs=prompt_logprobs(state.preparer.tokenizer, out, req.return_tokens_as_token_ids)
        if req.prompt_logprobs is not None else None,
        weight_version=state.backend.weight_version if weight_version is None else weight_version)


class _Sent:
    """What one choice has streamed so far, and its incremental parser (made on its first delta)."""

    def __init__(self, opened: bool = False, keep_ids: bool = False) -> None:
        self.opened = opened  # the prompt left a reasoning section open
        self.stream: OutputStream | None = None
        self.tokens = 0
        self.ids: list[int] | None = [] if keep_ids else None  # every sampled id, when a live count needs them
        self.last_ids: list[int] = []  # the last few sampled ids: they may complete a partial character's logprob token
        self.calls = 0
        self.done = False

    def span(self) -> tuple[int, int | None] | None:
        return self.stream.reasoning_span if self.stream is not None else None


def _delta(state: ServerState, req: ChatCompletionRequest, comp: CompletionOutput, sent: _Sent) -> dict[str, Any]:
    """A chunk choice from one DELTA output: its new text through the request's incremental parser, as the dict
    ChatChunkChoice's SSE encoding is (built directly: this runs once per token). `index`, `delta`, `logprobs` and
    `finish_reason` are always there (null when empty), as in OpenAI's chunk schema."""
    final = comp.finish_reason is not None
    piece = Delta(content=comp.text)
    if sent.stream is None and request_parser(state.parser, req).active:
        sent.stream = chat_stream(state, req, sent.opened)
    if sent.stream is not None:
        piece = sent.stream.feed(comp.text, final)
    calls = _calls(req, piece.tool_calls, sent.calls)
    deltas = [ToolCallDelta(index=sent.calls + i, id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
              for i, c in enumerate(calls)]
    sent.calls += len(calls)
    logprobs = None
    if req.logprobs:
        logprobs = ChoiceLogprobs(content=chat_logprobs(state.preparer.tokenizer, comp, 0, req.top_logprobs or 0,
                                                        req.return_tokens_as_token_ids, sent.last_ids))
    sent.tokens += len(comp.token_ids)
    if sent.ids is not None:
        sent.ids += comp.token_ids
    sent.last_ids = [*sent.last_ids, *comp.token_ids][-CONTEXT_TOKENS:]
    sent.done = final
    reasoning = piece.reasoning if req.include_reasoning else ""
    delta = compact(content=piece.content or None, reasoning=reasoning or None,  # vLLM's deltas: no alias
                    tool_calls=deltas or None) or ({} if sent.stream is not None else {"content": ""})  # vLLM: ""
    ending = {"stop_reason": comp.stop_reason} if final else {}  # vLLM sets it (maybe null) on the last chunk only
    return {"index": comp.index, "delta": delta, "logprobs": logprobs,
            "finish_reason": _finish(req, comp, sent.calls > 0) if final else None, **ending,
            "token_ids": list(comp.token_ids) if req.return_token_ids else None}  # vLLM: the key always, maybe null


def _live_usage(state: ServerState, req: ChatCompletionRequest, total: Usage | None, sent: _Sent,
                reasoning: bool) -> dict[str, Any] | None:
    """vLLM's continuous usage on a chat chunk: that choice's tokens so far, completion_tokens_details always there
    (null, or its reasoning tokens so far under a reasoning parser)."""
    if total is None:
        return None
    details = None
    if reasoning:
        details = {"reasoning_tokens": reasoning_tokens(state.preparer.tokenizer, sent.ids or [], sent.span(),
                                                        req.skip_special_tokens)}
    return {"prompt_tokens": total.prompt_tokens, "completion_tokens": total.completion_tokens,
            "total_tokens": total.total_tokens, "completion_tokens_details": details}


async def _chunks(state: ServerState, req: ChatCompletionRequest, gen: Generation, rid: str,
                  created: int, media: list[PromptMediaOut] | None) -> AsyncIterator[bytes | str]:
    """The role chunk of each choice, then one chunk per choice per output (vLLM and OpenAI: one choice a chunk),
    then the usage chunk when asked."""
    def chunk(choice: dict[str, Any], out: RequestOutput | None, head: dict[str, Any] | None = None,
              **extra: Any) -> bytes:
        return sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": state.config.model_name,
                    "choices": [choice], **(head or {}), **compact(**extra, weight_version=output_version(state, out))})

    assert gen.first is not None
    so_far = running_usage(req.stream_options, len(gen.first.prompt_token_ids))
    reasoning_on = request_parser(state.parser, req).reasoning is not None
    live_reasoning = reasoning_on and so_far(0) is not None
    sent = [_Sent(prompt_opens_reasoning(state, req, gen.first.prompt_token_ids), live_reasoning)
            for _ in range(req.n)]
    # vLLM sends system_fingerprint on a choice's last chunk, or on the usage chunk when one is asked for
    usage_asked = req.stream_options is not None and bool(req.stream_options.include_usage)

    def live_usage(i: int) -> dict[str, Any] | None:
        return _live_usage(state, req, so_far(sent[i].tokens), sent[i], live_reasoning)

    for i in range(req.n):
        role = {"index": i, "delta": {"role": "assistant", "content": echo_text(req)}, "logprobs": None,
                "finish_reason": None}
        ids = list(gen.first.prompt_token_ids) if req.return_token_ids and i == 0 else None
        yield chunk(role, None, {"prompt_token_ids": ids, "prompt_text": None},  # vLLM: both keys, maybe null
                    usage=live_usage(i), prompt_media=media if req.return_token_ids and i == 0 else None)

    def event(_: int, out: RequestOutput) -> bytes | None:
        events = []
        for c in out.outputs:
            if sent[c.index].done or not (c.token_ids or c.text or c.finish_reason):
                continue
            choice = _delta(state, req, c, sent[c.index])
            ending = {"system_fingerprint": SYSTEM_FINGERPRINT} if choice["finish_reason"] and not usage_asked else None
            events.append(chunk(choice, out, ending, usage=live_usage(c.index)))
        return b"".join(events) or None

    def usage_chunk(total: Usage) -> bytes | str:
        whole = gen.whole()
        parts = [(c, sent[c.index].span()) for c in whole.outputs] if whole is not None else []
        return sse(ChatCompletionChunk(id=rid, created=created, model=state.config.model_name, choices=[],
                                       usage=reasoning_usage(state, req, total, parts),
                                       system_fingerprint=SYSTEM_FINGERPRINT,
                                       weight_version=output_version(state, whole)))

    async for text in generation_events(gen, event, usage_chunk, req.stream_options):
        yield text


def tool_level(state: ServerState) -> ToolStrictLevel | None:
    """The server's tool strict level, or None when it has no tool parser (tool_choice "auto" stays free)."""
    return None if state.parser.tools is None else ToolStrictLevel.named(state.config.tool_strict_level)


async def chat_request_prompt(state: ServerState, req: ChatCompletionRequest) -> tuple[SamplingParams, PromptInput]:
    """A chat request's SamplingParams and (truncated) prompt: what the chat and render endpoints both start from."""
    check_tool_choice(req)
    params = to_sampling_params(req, state.backend.facts.vocab_size, state.sampling_defaults, tool_level(state))
    check_sequences(1, req.n, state.config.max_sequences_per_request)
    max_model_len, limit = state.backend.facts.max_model_len, state.config.max_logprob_entries
    params = clamp_lengths(params, max_model_len)
    check_answer_size(params, max_model_len, limit, [None], param=_logprobs_param(params))
    prompt = await build_chat_prompt(
        state, req.messages, add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message, chat_template_kwargs=template_kwargs(req),
        mm_processor_kwargs=req.mm_processor_kwargs, tools=req.tools if req.tool_choice != "none" else None,
        chat_template=req.chat_template, add_special_tokens=req.add_special_tokens, cache_salt=req.cache_salt,
        media_io_kwargs=req.media_io_kwargs)
    prompt = truncate_prompt(prompt, truncation_length(req.truncate_prompt_tokens, max_model_len),
                             state.preparer.placeholder_ids, state.preparer.merge_size)
    check_answer_size(params, max_model_len, limit, [expanded_length(prompt, state.preparer.merge_size)],
                      param=_logprobs_param(params))
    return params, prompt


def _logprobs_param(params: SamplingParams) -> str:
    return "top_logprobs" if params.logprobs is not None else "prompt_logprobs"


def expanded_length(prompt: PromptInput, merge_size: int) -> int:
    """The prompt's length once each media placeholder is expanded to its t*h*w/merge² tokens."""
    items = [*prompt.images, *prompt.videos, *prompt.audios]
    return len(prompt.token_ids or ()) + sum(it.num_tokens(merge_size) - 1 for it in items)


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest, request: Request):
    params, prompt = await chat_request_prompt(state, req)
    rid = f"chatcmpl-{req.request_id or uuid.uuid4().hex}"
    created = int(time.time())
    gen = Generation(state, prompt, params, rid, req.affinity_key, req.stream)
    media = (prompt_media(prompt.images, prompt.videos, prompt.audios) if req.return_token_ids
             else None)  # asked for only
    if req.stream:
        await watch(gen.start(), request.is_disconnected)
        return ClosingStreamingResponse(_chunks(state, req, gen, rid, created, media),
                                        media_type="text/event-stream")
    out = await gen.final(request.is_disconnected)
    items = len(out.prompt_token_ids) * (1 + (req.prompt_logprobs or 0)) + sum(
        len(c.token_ids) for c in out.outputs) * (1 + (req.top_logprobs or 0))
    return await json_answer(lambda: chat_response(state, req, out, rid, created, gen.weight_version, media), items)
