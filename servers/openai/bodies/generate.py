"""Token-in/token-out bodies (vLLM 0.32's /render and /inference/v1/generate shapes) and their SamplingParams."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from mm_infer.engine.sampling.params import LOGPROBS_MODES, RequestOutputKind, SamplingParams
from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.replies import PromptMediaOut, Usage
from servers.openai.bodies.requests import INT64_MAX, StreamOptions, Strict
from servers.openai.bodies.sampling_params import top_k_within
from servers.openai.prompting.admission import check_logit_bias, check_stops

MODALITIES = ("image", "video", "audio")  # audio: Nemotron Omni with an audio tower


class PlaceholderRangeInfo(Strict):
    """Where one media item sits in `token_ids`: its first pad token and the span to its last one."""

    offset: int = Field(ge=0)
    length: int = Field(gt=0)


class MultiModalFeatures(Strict):
    """vLLM's features: item hashes and placeholders per modality, plus our processed items (grids, frames).

    `kwargs_data[m][k]` is None (the item is looked up by hash in this server's feature cache, vLLM's meaning of
    null) or the item's pixel rows inline (`mm_payload: "tensors"` at render); never preprocessed again."""

    mm_hashes: dict[str, list[str]]
    mm_placeholders: dict[str, list[PlaceholderRangeInfo]]
    kwargs_data: dict[str, list[str | None]] | None = None
    mm_metadata: dict[str, list[str | None]] | None = None  # vLLM's EC-transfer metadata: accepted, unused
    mm_items: dict[str, list[PromptMediaOut]] | None = None  # ours: grid, frames, seconds per item (informative)

    @model_validator(mode="after")
    def _parallel(self) -> MultiModalFeatures:
        if unknown := set(self.mm_hashes) - set(MODALITIES):
            raise ValueError(f"unknown modalities {sorted(unknown)}; expected image, video and/or audio")
        for name in ("mm_placeholders", "kwargs_data", "mm_items"):
            per = getattr(self, name)
            if per is None:
                continue
            if set(per) != set(self.mm_hashes):
                raise ValueError(f"{name} must name the same modalities as mm_hashes")
            for m, hashes in self.mm_hashes.items():
                if len(per[m]) != len(hashes):
                    raise ValueError(f"{name}[{m!r}] has {len(per[m])} entries for {len(hashes)} {m} hashes")
        return self


class GenerateSampling(Strict):
    """vLLM's SamplingParams fields: the ones we honour, the ones that change nothing, and 400s for the rest."""

    n: int = Field(default=1, ge=1, le=128)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = 1.0
    top_k: int = Field(default=0, ge=-1, le=INT64_MAX)  # past the vocabulary: disabled
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)  # None: up to the context (vLLM's default)
    min_tokens: int = Field(default=0, ge=0, le=INT64_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    logprobs_mode: str = "raw_logprobs"  # ours (vLLM sets it per server)
    skip_special_tokens: bool = True
    detokenize: bool = True
    output_kind: int = Field(default=0, ge=0, le=2)  # vLLM's RequestOutputKind; streams are DELTA either way
    structured_outputs: dict[str, Any] | None = None
    # no effect here (vLLM's output shaping, hints and buffers)
    spaces_between_special_tokens: bool = True
    stream_interval: int | None = None
    skip_clone: bool = False
    output_text_buffer_length: int = 0
    flat_logprobs: bool = False
    extra_args: dict[str, Any] | None = None
    skip_reading_prefix_cache: bool | None = None
    watermarking: bool | None = None
    routed_experts_prompt_start: int = 0
    # 400 when set: nothing here implements them
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprob_token_ids: list[int] | None = None
    prompt_logprob_start: int | None = None
    logprob_token_ids: list[int] | None = None
    thinking_token_budget: int | None = None
    repetition_detection: dict[str, Any] | None = None
    trace_decode_token_ids: list[int] | None = None


_UNSUPPORTED = ("allowed_token_ids", "bad_words", "prompt_logprob_token_ids", "prompt_logprob_start",
                "logprob_token_ids", "thinking_token_budget", "repetition_detection", "trace_decode_token_ids")
_OURS = ("n", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens", "stop", "stop_token_ids",
         "include_stop_str_in_output", "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty",
         "logit_bias", "logprobs", "prompt_logprobs", "logprobs_mode", "skip_special_tokens", "detokenize",
         "structured_outputs", "routed_experts_prompt_start")


def to_engine_params(sp: GenerateSampling, vocab_size: int) -> SamplingParams:
    """The engine's SamplingParams, field for field (no server defaults: render already applied them)."""
    for name in _UNSUPPORTED:
        if getattr(sp, name) not in (None, []):
            raise ApiError(400, f"sampling_params.{name} is not supported by this server",
                           param=f"sampling_params.{name}")
    if sp.logprobs_mode not in LOGPROBS_MODES:
        raise ApiError(400, f"sampling_params.logprobs_mode must be one of {list(LOGPROBS_MODES)}",
                       param="sampling_params.logprobs_mode")
    if bad := [t for t in [*(sp.stop_token_ids or []), *(sp.logit_bias or {})] if not 0 <= t < vocab_size]:
        raise ApiError(400, f"sampling_params: token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})",
                       param="sampling_params")
    check_stops(sp.stop, "sampling_params.stop")  # the caps chat and completions apply
    check_logit_bias(sp.logit_bias, "sampling_params.logit_bias")
    fields = {name: getattr(sp, name) for name in _OURS}
    fields["top_k"] = top_k_within(sp.top_k, vocab_size)
    try:
        return SamplingParams(**fields)
    except (ValueError, TypeError) as e:
        raise ApiError(400, f"sampling_params: {e}", param="sampling_params") from None


def from_engine_params(params: SamplingParams) -> dict[str, Any]:
    """What render hands back: the resolved params under vLLM's names, defaults left out (vLLM's omit_defaults)."""
    fields = {name: getattr(params, name) for name in _OURS}
    if params.structured_outputs is not None:
        so = asdict(params.structured_outputs)
        fields["structured_outputs"] = {k: v for k, v in so.items() if v not in (None, False)}
    defaults = GenerateSampling()
    out = {k: v for k, v in fields.items()
           if v != getattr(defaults, k) and not (v in ([], {}) and getattr(defaults, k) is None)}
    if params.output_kind is not RequestOutputKind.CUMULATIVE:
        out["output_kind"] = params.output_kind.value
    return out


class GenerateRequest(Strict):
    """POST /inference/v1/generate, and what /render answers (vLLM's GenerateRequest fields)."""

    request_id: str | None = None
    model: str | None = None
    token_ids: list[int] = Field(min_length=1)
    features: MultiModalFeatures | None = None
    sampling_params: GenerateSampling = Field(default_factory=GenerateSampling)
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = Field(default=None, min_length=1)
    priority: int = 0
    return_token_ids: bool | None = None
    output_mode: Literal["tokens", "text"] = "tokens"
    affinity_key: str | None = Field(default=None, max_length=256)  # ours, as on chat (replica routing)
    # accepted as render (or vLLM's) sends them; they change nothing here
    token_offsets: list[tuple[int, int]] | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    content_parts: list[dict[str, Any]] | None = None  # 400 when set: send features (render first)
    kv_transfer_params: dict[str, Any] | None = None  # 400 when set: no KV connector
    ec_transfer_params: dict[str, Any] | None = None  # 400 when set: no encoder-cache connector


class GenerateLogProb(BaseModel):
    token_id: int
    logprob: float
    token: str  # "token_id:N": TRL <= 1.16 (vLLM <= 0.31) reads this name
    rank: int | None = None


class GenerateLogProbsContent(GenerateLogProb):
    top_logprobs: list[GenerateLogProb] = Field(default_factory=list)  # the sampled token first, then the top k


class GenerateLogProbs(BaseModel):
    content: list[GenerateLogProbsContent] | None = None


class GenerateChoice(BaseModel):
    index: int
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int]
    logprobs: GenerateLogProbs | None = None
    text: str | None = None  # output_mode "text"
    routed_experts: str | None = None  # R3 (vLLM's): the whole routing, on each choice's last chunk


class GenerateResponse(BaseModel):
    request_id: str
    model: str | None = None
    created: int | None = None
    output_mode: Literal["tokens", "text"] = "tokens"
    choices: list[GenerateChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    mm_placeholders: dict[str, list[PlaceholderRangeInfo]] | None = None
    weight_version: int | None = None
