"""POST /inference/v1/generate: expanded token ids plus render's features in, token ids and logprobs out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from mm_infer.engine.outputs.request_output import CompletionOutput, RequestOutput
from mm_infer.prompt.inputs import PromptInput
from mm_infer.prompt.request import VLMRequest
from servers.openai.answers.logprobs import json_logprob, usage
from servers.openai.answers.routed_experts import encode_routed_experts
from servers.openai.answers.streaming import (
    ClosingStreamingResponse,
    Generation,
    generation_events,
    output_version,
    sse,
    watch,
)
from servers.openai.bodies.errors import ApiError, from_exception
from servers.openai.bodies.generate import (
    GenerateChoice,
    GenerateLogProb,
    GenerateLogProbs,
    GenerateLogProbsContent,
    GenerateRequest,
    GenerateResponse,
    PlaceholderRangeInfo,
    to_engine_params,
)
from servers.openai.bodies.replies import Usage
from servers.openai.media.features import check_placeholders, item_spans, resolve_items
from servers.openai.prompting.admission import check_answer_size, check_sequences, clamp_lengths
from servers.openai.state import ServerState
from servers.openai.web.json_encoding import JsonBody, compact


def _check(state: ServerState, req: GenerateRequest) -> None:
    for name in ("content_parts", "kv_transfer_params", "ec_transfer_params"):
        if getattr(req, name) is not None:
            raise ApiError(400, f"{name} is not supported by this server (render the media first and send its "
                           "features)" if name == "content_parts" else f"{name} is not supported by this server",
                           param=name)
    if req.priority != 0:
        raise ApiError(400, "priority is not supported by this server (first come, first served); send 0",
                       param="priority")
    if req.output_mode == "text" and not req.sampling_params.detokenize:
        raise ApiError(400, "output_mode \"text\" needs sampling_params.detokenize", param="output_mode")
    if bad := [t for t in req.token_ids if not 0 <= t < state.backend.facts.vocab_size]:
        raise ApiError(400, f"token_ids outside the vocabulary [0, {state.backend.facts.vocab_size}): {bad[:5]}",
                       param="token_ids")


async def prepare_generate(state: ServerState, req: GenerateRequest) -> VLMRequest:
    """The prompt exactly as the chat request it was rendered from: ids checked against their features, the
    media taken from the feature cache (or inline), nothing expanded or preprocessed again."""
    defaults = state.preparer.media_defaults
    items = resolve_items(req.features, state.features, defaults.spec, defaults.audio)
    prompt = PromptInput(token_ids=req.token_ids, images=items["image"], videos=items["video"],
                         media_tokens_preexpanded=True, cache_salt=req.cache_salt, audios=items["audio"])
    try:
        prepared = await asyncio.to_thread(state.preparer.prepare, prompt)
    except Exception as exc:
        err = from_exception(exc)
        if err.status == 400:
            raise ApiError(400, f"token_ids do not match their features: {err.message}", param="token_ids") from exc
        raise err from exc
    check_placeholders(req.features, prepared)
    return prepared


def _logprobs(comp: CompletionOutput, k: int) -> GenerateLogProbs:
    """Per token: the sampled one and, in top_logprobs, it first and then the k most likely others."""
    content = []
    for i, t in enumerate(comp.token_ids):
        lp = json_logprob(comp.logprobs[i])
        alts = comp.top_logprobs[i] if comp.top_logprobs and i < len(comp.top_logprobs) else {}
        ranked = [(a, v) for a, v in sorted(alts.items(), key=lambda kv: -kv[1]) if a != t][:k]
        top = [GenerateLogProb(token_id=a, logprob=json_logprob(v), token=f"token_id:{a}")
               for a, v in [(t, comp.logprobs[i]), *ranked]]
        content.append(GenerateLogProbsContent(token_id=t, logprob=lp, token=f"token_id:{t}", top_logprobs=top))
    return GenerateLogProbs(content=content)


def _choice(req: GenerateRequest, comp: CompletionOutput) -> dict[str, Any]:
    """A GenerateChoice as the None-free dict its JSON is: encoded as it is in a streamed chunk, validated into the
    model in a whole answer."""
    k = req.sampling_params.logprobs
    return compact(index=comp.index, finish_reason=comp.finish_reason, stop_reason=comp.stop_reason,
                   token_ids=list(comp.token_ids), logprobs=None if k is None else _logprobs(comp, k),
                   text=comp.text if req.output_mode == "text" else None,
                   routed_experts=encode_routed_experts(comp.routed_experts))


def _placeholders(req: GenerateRequest, prepared: VLMRequest) -> dict[str, list[PlaceholderRangeInfo]] | None:
    if not req.return_token_ids or not prepared.items:
        return None
    out: dict[str, list[PlaceholderRangeInfo]] = {}
    for it, (offset, length) in zip(prepared.items, item_spans(prepared), strict=True):
        out.setdefault(it.modality, []).append(PlaceholderRangeInfo(offset=offset, length=length))
    return out


def _response(state: ServerState, req: GenerateRequest, prepared: VLMRequest, out: RequestOutput, rid: str,
              version: int | None) -> GenerateResponse:
    return GenerateResponse(
        request_id=rid, model=state.config.model_name, created=int(time.time()),
        output_mode=req.output_mode, choices=[GenerateChoice(**_choice(req, c)) for c in out.outputs], usage=usage(out),
        prompt_token_ids=list(out.prompt_token_ids) if req.return_token_ids else None,
        mm_placeholders=_placeholders(req, prepared), weight_version=version)


async def _chunks(state: ServerState, req: GenerateRequest, prepared: VLMRequest, gen: Generation,
                  rid: str) -> AsyncIterator[str]:
    sent_prompt = [False]

    def event(_: int, out: RequestOutput) -> str | None:
        choices = [_choice(req, c) for c in out.outputs if c.token_ids or c.finish_reason]
        if not choices:
            return None
        first = not sent_prompt[0] and bool(req.return_token_ids)
        sent_prompt[0] = True
        return sse(compact(request_id=rid, output_mode=req.output_mode, choices=choices,  # GenerateResponse's
                           prompt_token_ids=list(out.prompt_token_ids) if first else None,  # fields, None-free
                           mm_placeholders=_placeholders(req, prepared) if first else None,
                           weight_version=output_version(state, out)))

    def usage_chunk(total: Usage) -> bytes | str:
        return sse(GenerateResponse(request_id=rid, output_mode=req.output_mode, choices=[], usage=total))

    async for text in generation_events(gen, event, usage_chunk, req.stream_options):
        yield text


async def generate_tokens(state: ServerState, req: GenerateRequest, request: Request, base_id: str):
    _check(state, req)
    params = to_engine_params(req.sampling_params, state.backend.facts.vocab_size)
    check_sequences(1, params.n, state.config.max_sequences_per_request)
    max_model_len = state.backend.facts.max_model_len
    params = clamp_lengths(params, max_model_len)
    param = "sampling_params." + ("logprobs" if params.logprobs is not None else "prompt_logprobs")
    check_answer_size(params, max_model_len, state.config.max_logprob_entries, [len(req.token_ids)], param=param)
    prepared = await prepare_generate(state, req)
    rid = f"generate-tokens-{base_id}"
    gen = Generation(state, prepared, params, rid, req.affinity_key, req.stream)
    if req.stream:
        await watch(gen.start(), request.is_disconnected)
        return ClosingStreamingResponse(_chunks(state, req, prepared, gen, rid), media_type="text/event-stream")
    out = await gen.final(request.is_disconnected)
    return JsonBody(_response(state, req, prepared, out, rid, gen.weight_version))
