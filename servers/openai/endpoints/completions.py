"""POST /v1/completions: text or token-id prompts (one or a batch), whole or streamed."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from fastapi import Request

from mm_infer.engine.outputs.request_output import CompletionOutput, RequestOutput
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.prompt.chat_prompt import truncate_ids
from mm_infer.prompt.inputs import PromptInput
from servers.openai.answers.logprobs import (
    completion_logprobs,
    echo_logprobs,
    join_logprobs,
    prompt_logprobs,
    running_usage,
    usage,
)
from servers.openai.answers.routed_experts import encode_routed_experts
from servers.openai.answers.streaming import (
    ClosingStreamingResponse,
    Generation,
    merge_streams,
    output_version,
    sse,
    sse_events,
    watch,
)
from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.replies import (
    SYSTEM_FINGERPRINT,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    Usage,
)
from servers.openai.bodies.requests import CompletionRequest
from servers.openai.bodies.sampling_params import to_sampling_params
from servers.openai.prompting.admission import check_answer_size, check_sequences, check_text, clamp_lengths
from servers.openai.prompting.prompt_limits import truncation_length
from servers.openai.state import ServerState
from servers.openai.web.json_encoding import JsonBody, compact


def split_prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The request's prompts: one text, one id list, or a batch of either."""
    raw = req.prompt
    if raw is None:
        raise ApiError(400, "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    if isinstance(raw, str):
        prompts: list[str | list[int]] = [raw]
    elif raw and all(isinstance(x, int) for x in raw):
        prompts = [list(raw)]  # type: ignore[arg-type]
    else:
        prompts = list(raw)  # type: ignore[arg-type]
    if not prompts:
        raise ApiError(400, "prompt is empty", param="prompt")
    return prompts


def echo_texts(tokenizer: Any, texts: Sequence[str | list[int]], full: list[list[int]],
               kept: list[list[int]], return_token_ids: bool = False) -> list[str]:
    """What echo repeats: a text prompt as sent; an id prompt, or a truncated one, decoded. With return_token_ids
    the prompt comes back as its ids (prompt_token_ids) and the echoed text is empty, as vLLM 0.32 answers."""
    if return_token_ids:
        return [""] * len(texts)
    return [t if isinstance(t, str) and len(k) == len(f) else tokenizer.decode(k, skip_special_tokens=False)
            for t, f, k in zip(texts, full, kept, strict=True)]


def answered(req: CompletionRequest, c: CompletionOutput) -> CompletionOutput:
    """What a sample answers: nothing generated for echo with max_tokens 0 (vLLM makes one token, then drops it)."""
    if not (req.echo and req.max_tokens == 0):
        return c
    return replace(c, text="", token_ids=[], logprobs=[], top_logprobs=[] if c.top_logprobs is not None else None)


def prompt_ids(state: ServerState, req: CompletionRequest, prompts: list[str | list[int]]) -> list[list[int]]:
    """Each prompt as token ids: text is tokenized here (call it off the event loop), id lists taken as given."""
    encode = state.preparer.renderer.encode
    out = [encode(p, add_special_tokens=req.add_special_tokens) if isinstance(p, str) else list(p) for p in prompts]
    for i, ids in enumerate(out):
        if not ids:
            raise ApiError(400, f"prompt {i} is empty", param="prompt")
        if bad := [t for t in ids if not 0 <= t < state.backend.facts.vocab_size]:
            raise ApiError(400, f"prompt {i} has token ids outside the vocabulary: {bad[:5]}", param="prompt")
    return out


def _logprobs(state: ServerState, req: CompletionRequest, out: RequestOutput, c: CompletionOutput,
              echo: str | None, at: int = 0) -> CompletionLogprobs | None:
    """The sample's legacy logprobs (after the echoed prompt's, when echoing), text offsets from `at`."""
    if req.logprobs is None:
        return None
    tok, as_ids = state.preparer.tokenizer, req.return_tokens_as_token_ids
    generated = completion_logprobs(tok, c, req.logprobs, as_ids, at=at)
    return generated if echo is None else join_logprobs(echo_logprobs(tok, out, req.logprobs, as_ids), generated)


def _choices(state: ServerState, req: CompletionRequest, out: RequestOutput, base: int,
             echo: str | None) -> list[CompletionChoice]:
    as_ids = req.return_tokens_as_token_ids
    tok = state.preparer.tokenizer
    return [CompletionChoice(
        index=base + c.index, text=(echo or "") + c.text, finish_reason=c.finish_reason, stop_reason=c.stop_reason,
        logprobs=_logprobs(state, req, out, c, echo), token_ids=list(c.token_ids) if req.return_token_ids else None,
        prompt_token_ids=list(out.prompt_token_ids) if req.return_token_ids else None,
        prompt_logprobs=prompt_logprobs(tok, out, as_ids) if req.prompt_logprobs is not None else None,
        routed_experts=encode_routed_experts(c.routed_experts))
        for c in map(partial(answered, req), out.outputs)]


def _delta(state: ServerState, req: CompletionRequest, out: RequestOutput, c: CompletionOutput, index: int,
           echo: str | None, at: int, first: bool) -> dict[str, Any]:
    """A chunk choice from one DELTA output of one sample (the first one echoes the prompt, when asked, and carries
    the prompt's ids with return_token_ids or echo, as vLLM's): CompletionChoice's SSE encoding, built directly (this
    runs once per token). Every key is always there (null when empty), as in vLLM's chunks."""
    return {"index": index, "text": (echo or "") + c.text, "logprobs": _logprobs(state, req, out, c, echo, at),
            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,  # vLLM: every key, maybe null
            "prompt_token_ids": list(out.prompt_token_ids) if (req.return_token_ids or echo is not None) and first
            else None, "token_ids": list(c.token_ids) if req.return_token_ids else None}


async def _stream(state: ServerState, req: CompletionRequest, gens: list[Generation], rid: str, created: int,
                  echoes: list[str] | None) -> AsyncIterator[bytes | str]:
    """One chunk per choice per output (vLLM and OpenAI: one choice a chunk), then the usage chunk when asked."""
    def head(out: RequestOutput | None = None) -> dict:
        return {"id": rid, "created": created, "model": state.config.model_name,
                "weight_version": output_version(state, out)}

    chars: dict[int, int] = {}  # each choice's next text offset
    generated = [0] * len(gens)
    # vLLM sends system_fingerprint on a choice's last chunk, or on the usage chunk when one is asked for
    usage_asked = req.stream_options is not None and bool(req.stream_options.include_usage)

    def event(i: int, out: RequestOutput) -> bytes | None:
        events = []
        generated[i] += sum(len(c.token_ids) for c in out.outputs)
        so_far = running_usage(req.stream_options, len(out.prompt_token_ids))(generated[i])
        for c in map(partial(answered, req), out.outputs):
            index = i * req.n + c.index
            first = index not in chars
            echo = echoes[i] if echoes is not None and first else None
            carries = echo is not None or (first and req.return_token_ids)  # sent even when nothing is new
            if not carries and not (c.token_ids or c.text or c.finish_reason):
                continue
            choice = _delta(state, req, out, c, index, echo, chars.get(index, 0), first)
            chars[index] = _next_offset(choice, chars.get(index, 0))
            ending = SYSTEM_FINGERPRINT if choice["finish_reason"] and not usage_asked else None
            events.append(sse({"id": rid, "object": "text_completion", "created": created,
                               "model": state.config.model_name, "choices": [choice],
                               **compact(usage=so_far, weight_version=output_version(state, out),
                                         system_fingerprint=ending)}))
        return b"".join(events) or None

    def tail() -> bytes | None:
        wholes = [g.whole() for g in gens]
        if not all(w is not None and w.finished for w in wholes):
            return None
        if req.stream_options is None or not req.stream_options.include_usage:
            return None
        return sse(CompletionResponse(**head(), choices=[], usage=_sum([usage(w) for w in wholes if w])))

    async def close() -> None:
        await asyncio.gather(*(g.aclose() for g in gens), return_exceptions=True)

    async for text in sse_events(merge_streams(gens), event, close, tail):
        yield text


def _next_offset(choice: dict[str, Any], at: int) -> int:
    """The text offset after a chunk: vLLM's (the last token's offset plus its logprob string, so a partial
    character's "" adds nothing), or the text streamed so far without logprobs."""
    lp = choice["logprobs"]
    if lp is not None and lp.tokens:
        return lp.text_offset[-1] + len(lp.tokens[-1])
    return at + len(choice["text"])


def _sum(totals: list[Usage]) -> Usage:
    prompt = sum(u.prompt_tokens for u in totals)
    generated = sum(u.completion_tokens for u in totals)
    return Usage(prompt_tokens=prompt, completion_tokens=generated, total_tokens=prompt + generated)


async def completion_prompts(state: ServerState, req: CompletionRequest
                             ) -> tuple[SamplingParams, list[str | list[int]], list[list[int]], list[list[int]]]:
    """A completion request checked and tokenized: (params, prompts as sent, their full ids, the truncated ids);
    what the completion and render endpoints both start from."""
    params = to_sampling_params(req, state.backend.facts.vocab_size, state.sampling_defaults)
    texts = split_prompts(req)
    check_sequences(len(texts), req.n, state.config.max_sequences_per_request)
    max_model_len, limit = state.backend.facts.max_model_len, state.config.max_logprob_entries
    params = clamp_lengths(params, max_model_len)
    param = "logprobs" if params.logprobs is not None else "prompt_logprobs"
    check_answer_size(params, max_model_len, limit, [None] * len(texts), req.n, param)  # before tokenizing
    check_text(state.preparer.tokenizer, state.backend.facts.max_model_len, (p for p in texts if isinstance(p, str)),
               "prompt")
    keep = truncation_length(req.truncate_prompt_tokens, state.backend.facts.max_model_len)
    full = await asyncio.to_thread(prompt_ids, state, req, texts)
    kept = [truncate_ids(ids, keep) for ids in full]
    check_answer_size(params, max_model_len, limit, [len(ids) for ids in kept], req.n, param)
    return params, texts, full, kept


async def create_completion(state: ServerState, req: CompletionRequest, request: Request):
    params, texts, full, prompts = await completion_prompts(state, req)
    echoes = await asyncio.to_thread(echo_texts, state.preparer.tokenizer, texts, full, prompts,
                                     bool(req.return_token_ids)) if req.echo else None
    rid = f"cmpl-{req.request_id or uuid.uuid4().hex}"
    created = int(time.time())
    gens = [Generation(state, PromptInput(token_ids=ids, cache_salt=req.cache_salt), params, f"{rid}-{i}",
                       req.affinity_key, req.stream) for i, ids in enumerate(prompts)]
    if req.stream:
        starts = [asyncio.ensure_future(g.start()) for g in gens]
        try:
            await watch(asyncio.gather(*starts), request.is_disconnected)
        except BaseException:  # one bad prompt fails the batch: stop the other starts, abort what started
            for task in starts:
                task.cancel()
            await asyncio.gather(*starts, return_exceptions=True)
            await asyncio.gather(*(g.aclose() for g in gens), return_exceptions=True)
            raise
        return ClosingStreamingResponse(_stream(state, req, gens, rid, created, echoes),
                                        media_type="text/event-stream")
    tasks = [asyncio.ensure_future(g.final(request.is_disconnected)) for g in gens]
    try:
        outs = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:  # one bad prompt fails the batch: stop (and free) the others
            task.cancel()
        raise
    choices = [ch for i, out in enumerate(outs)
               for ch in _choices(state, req, out, i * req.n, echoes[i] if echoes is not None else None)]
    return JsonBody(CompletionResponse(id=rid, created=created, model=state.config.model_name, choices=choices,
                                       usage=_sum([usage(o) for o in outs]),
                                       weight_version=max(g.weight_version or 0 for g in gens)))
