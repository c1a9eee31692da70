"""POST /v1/chat/completions/render and /v1/completions/render: a request's expanded ids, features and params."""

from __future__ import annotations

import asyncio
from typing import Any

from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.prompt.inputs import PromptInput
from mm_infer.prompt.request import VLMRequest
from servers.openai.bodies.errors import ApiError, from_exception
from servers.openai.bodies.generate import GenerateRequest, GenerateSampling, from_engine_params
from servers.openai.bodies.requests import ChatCompletionRequest, CompletionRequest
from servers.openai.endpoints.chat import chat_request_prompt
from servers.openai.endpoints.completions import completion_prompts
from servers.openai.media.features import features_of
from servers.openai.state import ServerState


def _inline(req: Any) -> bool:
    """Pixels inline only when asked (vLLM's mm_payload "tensors"); by default the features name cached items."""
    return req.mm_payload == "tensors" or (req.mm_payload is None and req.return_mm_kwargs is True)


async def _prepare(state: ServerState, prompt: PromptInput) -> VLMRequest:
    try:
        return await asyncio.to_thread(state.preparer.prepare, prompt)
    except Exception as exc:
        raise from_exception(exc) from exc


def _generate_request(req: Any, rid: str, prepared: VLMRequest, params: SamplingParams,
                      inline: bool) -> dict[str, Any]:
    """vLLM's render answer: a GenerateRequest (its sampling_params without the defaults)."""
    out = GenerateRequest(
        request_id=rid, model=req.model, token_ids=list(prepared.prompt_token_ids),
        features=features_of(prepared, inline), sampling_params=GenerateSampling(**from_engine_params(params)),
        stream=req.stream, stream_options=req.stream_options if req.stream else None, cache_salt=req.cache_salt,
        affinity_key=req.affinity_key)
    return {**out.model_dump(), "sampling_params": out.sampling_params.model_dump(exclude_defaults=True)}


def _check(req: Any) -> None:
    if req.echo:
        raise ApiError(400, "echo is not supported by the render endpoints (generate answers token ids only)",
                       param="echo")


async def render_chat(state: ServerState, req: ChatCompletionRequest, base_id: str) -> dict[str, Any]:
    """The GenerateRequest /inference/v1/generate answers exactly as /v1/chat/completions answers `req`."""
    _check(req)
    params, prompt = await chat_request_prompt(state, req)
    prepared = await _prepare(state, prompt)
    state.features.put(prepared.items)
    return _generate_request(req, f"chatcmpl-{base_id}", prepared, params, _inline(req))


async def render_completion(state: ServerState, req: CompletionRequest, base_id: str) -> list[dict[str, Any]]:
    """One GenerateRequest per prompt (vLLM's list), ids "cmpl-ID" or, for a batch, "cmpl-ID-i"."""
    _check(req)
    if req.max_tokens == 0:
        raise ApiError(400, "max_tokens must be at least 1", param="max_tokens")
    params, _, full, prompts = await completion_prompts(state, req)
    out = []
    for i, ids in enumerate(prompts):
        prepared = await _prepare(state, PromptInput(token_ids=ids, cache_salt=req.cache_salt))
        rid = f"cmpl-{base_id}" if len(full) == 1 else f"cmpl-{base_id}-{i}"
        out.append(_generate_request(req, rid, prepared, params, False))
    return out
