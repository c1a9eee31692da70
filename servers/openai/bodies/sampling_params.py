"""A chat or completions body to SamplingParams: vLLM's checks, the generation-config defaults, logprobs and stops."""

from __future__ import annotations

import re
from typing import Any

from mm_infer.engine.sampling.params import LOGPROBS_MODES, SamplingParams
from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.generation_defaults import max_tokens_cap, sampling_value
from servers.openai.bodies.requests import ChatCompletionRequest, CompletionRequest, NamedToolChoice, SamplingFields
from servers.openai.bodies.structured import structured_outputs_params
from servers.openai.bodies.tool_grammar import ToolStrictLevel
from servers.openai.bodies.vllm_fields import (
    check_best_of,
    check_openai_fields,
    check_prompt_logprobs,
    check_vllm_fields,
)
from servers.openai.prompting.admission import check_logit_bias, check_stops

_TOKEN_ID = re.compile(r"-?[0-9]{1,18}")  # ASCII digits only: "²".isdigit() is True, int("²") is an error


def _logit_bias(raw: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    """logit_bias's keys as token ids (values are range-checked by admission.check_logit_bias)."""
    if not raw:
        return None
    out: dict[int, float] = {}
    for key, value in raw.items():
        if _TOKEN_ID.fullmatch(key) is None or not 0 <= int(key) < vocab_size:
            raise ApiError(400, f"logit_bias key {key!r} is not a token id in [0, {vocab_size})", param="logit_bias")
        out[int(key)] = float(value)
    return out


def top_k_within(top_k: int, vocab_size: int) -> int:
    """top_k at or past the vocabulary keeps every token: disabled (0), as vLLM's input batch treats it."""
    return 0 if top_k >= vocab_size else top_k


def _top_logprobs(req: SamplingFields) -> int | None:
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs and not req.logprobs:  # 0 without logprobs is fine (vLLM's rule)
            raise ApiError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        return (req.top_logprobs or 0) if req.logprobs else None
    assert isinstance(req, CompletionRequest)
    return req.logprobs


def check_tool_choice(req: ChatCompletionRequest) -> None:
    """"required" and a named function force tool calls (a grammar): they need tools, and the name one of them."""
    choice, names = req.tool_choice, [t.function.name for t in req.tools or []]
    if choice == "required" and not names:
        raise ApiError(400, "tool_choice 'required' needs tools", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.get("name") not in names:
        raise ApiError(400, f"tool_choice names function {choice.function.get('name')!r}, which is not in tools "
                       f"{names}", param="tool_choice")


def _max_tokens(req: SamplingFields, defaults: dict[str, Any]) -> int | None:
    max_tokens = req.max_tokens
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
    if max_tokens == 0:  # a completion with echo: the prompt alone (vLLM makes one token and drops it)
        if not (isinstance(req, CompletionRequest) and req.echo):
            raise ApiError(400, "max_tokens must be at least 1 (0 only with echo)", param="max_tokens")
        return 1
    return max_tokens_cap(max_tokens, defaults)


def _prompt_logprobs(req: SamplingFields) -> int | None:
    if req.prompt_logprobs is None and isinstance(req, CompletionRequest) and req.echo:
        return req.logprobs  # vLLM: an echoed prompt is scored with the answer's logprobs
    return req.prompt_logprobs


def to_sampling_params(req: SamplingFields, vocab_size: int, defaults: dict[str, Any] | None = None,
                       tool_level: ToolStrictLevel | None = None) -> SamplingParams:
    """Build SamplingParams; max_tokens None means up to the context length (the engine clamps). `defaults` are
    the server's generation-config defaults for the sampling fields the request leaves out; `tool_level` its tool
    strict level (None without a tool parser)."""
    defaults = defaults or {}
    mode = req.logprobs_mode or "raw_logprobs"
    if mode not in LOGPROBS_MODES:
        raise ApiError(400, f"logprobs_mode {mode!r} is not supported; use one of {list(LOGPROBS_MODES)}",
                       param="logprobs_mode")
    check_vllm_fields(req)
    if isinstance(req, ChatCompletionRequest):
        check_openai_fields(req)
    check_best_of(req.best_of)  # type: ignore[attr-defined]  # both request kinds have it
    if req.stream_options is not None and not req.stream:  # vLLM's rule
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    check_prompt_logprobs(req.prompt_logprobs, req.stream)
    check_stops(req.stop)
    check_logit_bias(req.logit_bias)
    bad_stop = [t for t in req.stop_token_ids or [] if not 0 <= t < vocab_size]
    if bad_stop:
        raise ApiError(400, f"stop_token_ids {bad_stop} are not token ids in [0, {vocab_size})",
                       param="stop_token_ids")
    temperature = sampling_value("temperature", req.temperature, defaults)
    try:
        return SamplingParams(
            n=req.n, temperature=temperature,
            top_p=sampling_value("top_p", req.top_p, defaults),
            top_k=top_k_within(sampling_value("top_k", req.top_k, defaults), vocab_size),
            min_p=sampling_value("min_p", req.min_p, defaults), seed=req.seed, max_tokens=_max_tokens(req, defaults),
            min_tokens=req.min_tokens, stop=req.stop, stop_token_ids=req.stop_token_ids,
            include_stop_str_in_output=req.include_stop_str_in_output, ignore_eos=req.ignore_eos,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            repetition_penalty=sampling_value("repetition_penalty", req.repetition_penalty, defaults),
            logit_bias=_logit_bias(req.logit_bias, vocab_size), logprobs=_top_logprobs(req),
            prompt_logprobs=_prompt_logprobs(req), logprobs_mode=mode, skip_special_tokens=req.skip_special_tokens,
            structured_outputs=structured_outputs_params(req, tool_level),
            routed_experts_prompt_start=req.routed_experts_prompt_start)
    except ValueError as e:
        raise ApiError(400, str(e)) from None
