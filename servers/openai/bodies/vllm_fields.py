"""vLLM's request fields beyond OpenAI's, and OpenAI's own we do not act on: the models and the 400s for the ones we
cannot honour."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servers.openai.bodies.errors import ApiError

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs: the most alternatives per token, generated or prompt


class VllmStrict(BaseModel):
    """Unknown fields and non-finite numbers are a 400 naming the field (the same rule as protocol.Strict)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def drop_nulls(data: Any, names: frozenset[str]) -> Any:
    """A body without the `names` sent as null: vLLM types them Optional, so null means the default."""
    if isinstance(data, dict) and any(data.get(k, 0) is None for k in names):
        return {k: v for k, v in data.items() if not (v is None and k in names)}
    return data


class NullMeansDefault(BaseModel):
    """Fields in NULL_IS_DEFAULT take their default when sent as null (clients that serialise every field)."""

    NULL_IS_DEFAULT: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        return drop_nulls(data, cls.NULL_IS_DEFAULT)


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
    routed_experts_prompt_start: int = Field(default=0, ge=0)  # R3: the routing returned skips this many tokens


class OpenAIChatFields(VllmStrict):
    """OpenAI's chat fields this server does not act on: ignored where that leaves the answer as OpenAI's would be
    (hints, bookkeeping), a 400 by check_openai_fields where it would not (see servers/openai/README.md)."""

    store: bool | None = None  # nothing is stored
    metadata: dict[str, str] | None = None  # stored completions' tags: nothing is stored
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None  # one tier here
    prompt_cache_key: str | None = None  # a cache-routing hint; the prefix cache needs none
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    safety_identifier: str | None = None  # an end-user id for abuse tracking, like user
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint vLLM ignores too
    prediction: dict[str, Any] | None = None  # predicted output: a latency hint, the answer is the same
    modalities: list[Literal["text", "audio"]] | None = None  # ["text"] only
    audio: dict[str, Any] | None = None  # audio output: a 400 when set
    web_search_options: dict[str, Any] | None = None  # built-in web search: a 400 when set
    functions: list[dict[str, Any]] | None = None  # the deprecated tools: a 400 when non-empty (send tools)
    function_call: Literal["none", "auto"] | dict[str, Any] | None = None  # a named one is a 400 (tool_choice)


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


def check_openai_fields(req: Any) -> None:
    """400 for OpenAI chat fields whose values this server cannot honour (each would change the answer)."""
    if req.modalities is not None and "audio" in req.modalities:
        raise _unsupported("modalities", " (text output only); send [\"text\"]")
    if req.audio is not None:
        raise _unsupported("audio", " (text output only)")
    if req.web_search_options is not None:
        raise _unsupported("web_search_options", " (no built-in web search)")
    if req.functions:
        raise _unsupported("functions", " (deprecated by OpenAI); send tools")
    if isinstance(req.function_call, dict):  # "none" / "auto" without functions change nothing
        raise _unsupported("function_call", " (deprecated by OpenAI); send tool_choice")


def check_best_of(best_of: int | None) -> None:
    """best_of 1 (or null) is one sample, as without it; more would pick the best of several: not done here."""
    if best_of is not None and best_of != 1:
        raise _unsupported("best_of", " (only 1: no server-side best-of sampling); send n instead")


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
