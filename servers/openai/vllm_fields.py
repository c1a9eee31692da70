"""vLLM's request fields beyond OpenAI's: the models that accept them and the 400s for the ones we cannot honour."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from servers.openai.replies import ApiError

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs: the most alternatives per token, generated or prompt


class VllmStrict(BaseModel):
    """Unknown fields and non-finite numbers are a 400 naming the field (the same rule as protocol.Strict)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class VllmSamplingFields(VllmStrict):
    """Fields vLLM's chat and completion requests both take (see servers/openai/README.md for each verdict)."""

    use_beam_search: bool = False
    length_penalty: float = 1.0  # beam search only: no effect without it (as in vLLM)
    spaces_between_special_tokens: bool = True  # byte-level BPE puts no space between special tokens anyway
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)  # keep the last k; -1: max_model_len
    allowed_token_ids: list[int] | None = None
    priority: int = 0
    logits_processors: list[Any] | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None  # read only by custom logits processors, and there are none here
    max_repetition_pattern_size: int = Field(default=0, ge=0)
    min_repetition_pattern_size: int = Field(default=0, ge=0)
    repetition_min_count: int = Field(default=0, ge=0)
    mm_payload: Literal["tensors", "none"] | None = None  # render only: "tensors" carries the pixels inline
    return_mm_kwargs: bool | None = None  # vLLM's deprecated alias: true is "tensors"


class VllmChatFields(VllmStrict):
    """Fields only vLLM's chat request takes."""

    bad_words: list[str] = Field(default_factory=list)
    echo: bool = False  # prepend the last message's text when it has the answer's role
    add_special_tokens: bool = False  # on top of what the template adds
    documents: list[dict[str, str]] | None = None  # RAG documents, handed to the chat template
    chat_template: str | None = None  # a per-request jinja template (rendered in the sandbox)
    reasoning_effort: str | None = None  # handed to the chat template, as vLLM does
    include_reasoning: bool = True  # False: answers carry no reasoning


class VllmCompletionFields(VllmStrict):
    """Fields only vLLM's completion request takes."""

    echo: bool = False  # the prompt (text and, with logprobs, its logprobs) before the generated text
    suffix: str | None = None
    prompt_embeds: bytes | list[bytes] | None = None


def _unsupported(name: str, why: str = "") -> ApiError:
    return ApiError(400, f"{name} is not supported by this server{why}", param=name)


_ZERO_OR_OFF = ("max_repetition_pattern_size", "min_repetition_pattern_size", "repetition_min_count")


def check_vllm_fields(req: Any) -> None:
    """400 for every vLLM field set to a value that would change the output in a way this server cannot honour."""
    if req.use_beam_search:
        raise _unsupported("use_beam_search")
    if req.allowed_token_ids is not None:
        raise _unsupported("allowed_token_ids", " (no logit mask beyond logit_bias)")
    if getattr(req, "bad_words", None):
        raise _unsupported("bad_words", " (no logit mask beyond logit_bias)")
    if req.priority != 0:
        raise _unsupported("priority", " (it schedules first come, first served, like vLLM's default policy); "
                           "send priority 0")
    if req.logits_processors:
        raise _unsupported("logits_processors")
    if req.kv_transfer_params is not None:
        raise _unsupported("kv_transfer_params", " (no KV connector)")
    for name in _ZERO_OR_OFF:
        if getattr(req, name):
            raise _unsupported(name, " (no repetition-pattern stop)")
    if getattr(req, "suffix", None) is not None:
        raise _unsupported("suffix")
    if getattr(req, "prompt_embeds", None) is not None:
        raise _unsupported("prompt_embeds")
    if req.cache_salt is not None and not req.cache_salt:
        raise ApiError(400, "cache_salt must be a non-empty string", param="cache_salt")
    if req.truncate_prompt_tokens == 0:
        raise ApiError(400, "truncate_prompt_tokens must be -1 (max_model_len) or at least 1",
                       param="truncate_prompt_tokens")


def check_prompt_logprobs(k: int | None, stream: bool) -> None:
    """vLLM's rules: at most MAX_LOGPROBS alternatives, and none in a stream (its own logprob, k = 0, is fine)."""
    if k is None:
        return
    if k > MAX_LOGPROBS:
        raise ApiError(400, f"prompt_logprobs {k} is more than this server's maximum of {MAX_LOGPROBS}",
                       param="prompt_logprobs")
    if stream and k > 0:
        raise ApiError(400, "prompt_logprobs > 0 is not available when stream=true", param="prompt_logprobs")


def template_kwargs(req: Any) -> dict[str, Any] | None:
    """chat_template_kwargs with vLLM's extra template inputs (documents, reasoning_effort) merged in."""
    extra = {"documents": getattr(req, "documents", None), "reasoning_effort": getattr(req, "reasoning_effort", None)}
    extra = {k: v for k, v in extra.items() if v is not None}
    if not extra:
        return req.chat_template_kwargs
    return {**(req.chat_template_kwargs or {}), **extra}
