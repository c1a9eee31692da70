"""Request fields -> engine SamplingParams: every OpenAI / vLLM parameter we honour, 400 for the rest."""

from __future__ import annotations

from mm_infer.engine.sampling import LOGPROBS_MODES, SamplingParams
from servers.openai.errors import ApiError
from servers.openai.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields


def _logit_bias(raw: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    if not raw:
        return None
    out: dict[int, float] = {}
    for key, value in raw.items():
        if not key.lstrip("-").isdigit() or not 0 <= int(key) < vocab_size:
            raise ApiError(400, f"logit_bias key {key!r} is not a token id in [0, {vocab_size})", param="logit_bias")
        if not -100.0 <= value <= 100.0:
            raise ApiError(400, f"logit_bias value {value} is outside [-100, 100]", param="logit_bias")
        out[int(key)] = float(value)
    return out


def _top_logprobs(req: SamplingFields) -> int | None:
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        return (req.top_logprobs or 0) if req.logprobs else None
    assert isinstance(req, CompletionRequest)
    return req.logprobs


def check_tool_choice(req: ChatCompletionRequest) -> None:
    choice = req.tool_choice
    if choice is not None and not isinstance(choice, str):
        raise ApiError(400, "a named tool_choice needs guided decoding, which this server does not do",
                       param="tool_choice")
    if choice == "required":
        raise ApiError(400, "tool_choice 'required' needs guided decoding, which this server does not do",
                       param="tool_choice")


def to_sampling_params(req: SamplingFields, vocab_size: int) -> SamplingParams:
    """Build SamplingParams; max_tokens None means up to the context length (the engine clamps)."""
    max_tokens = req.max_tokens
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
    mode = req.logprobs_mode or "raw_logprobs"
    if mode not in LOGPROBS_MODES:
        raise ApiError(400, f"logprobs_mode {mode!r} is not supported; use one of {list(LOGPROBS_MODES)}",
                       param="logprobs_mode")
    if req.prompt_logprobs:
        raise ApiError(400, "prompt_logprobs > 0 (top alternatives per prompt token) is not supported; use 0 for "
                       "each prompt token's own logprob", param="prompt_logprobs")
    bad_stop = [t for t in req.stop_token_ids or [] if not 0 <= t < vocab_size]
    if bad_stop:
        raise ApiError(400, f"stop_token_ids {bad_stop} are not token ids in [0, {vocab_size})",
                       param="stop_token_ids")
    try:
        return SamplingParams(
            n=req.n, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k or 0,
            min_p=req.min_p or 0.0, seed=req.seed, max_tokens=max_tokens, min_tokens=req.min_tokens,
            stop=req.stop, stop_token_ids=req.stop_token_ids, include_stop_str_in_output=req.include_stop_str_in_output,
            ignore_eos=req.ignore_eos, presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            logit_bias=_logit_bias(req.logit_bias, vocab_size), logprobs=_top_logprobs(req),
            prompt_logprobs=req.prompt_logprobs, logprobs_mode=mode, skip_special_tokens=req.skip_special_tokens)
    except ValueError as e:
        raise ApiError(400, str(e)) from None
