"""Response bodies (chat, completions, streamed chunks, models, tokenize, RL control) in vLLM's shapes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from mm_infer import __version__

SYSTEM_FINGERPRINT = f"mm-infer-{__version__}"  # vLLM's is "vllm-<version>-<config hash>"; a string either way


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolCallDelta(ToolCallOut):
    index: int


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None  # OpenAI's message fields vLLM sends as null
    annotations: Any = None
    audio: Any = None
    function_call: Any = None
    reasoning: str | None = None  # vLLM's current name
    reasoning_content: str | None = None  # its deprecated alias (same text)
    tool_calls: list[ToolCallOut] = Field(default_factory=list)  # left out when empty, as vLLM does
    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float] | None = None

    @model_serializer(mode="wrap")
    def _without_empty_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if not out.get("tool_calls"):
            out.pop("tool_calls", None)
        return out


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None
    completion_tokens_details: dict[str, int] | None = None  # vLLM: {"reasoning_tokens": N} with a reasoning parser


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    routed_experts: str | None = None  # vLLM's R3 field (null: routing is not returned)


class PromptMediaOut(BaseModel):
    """One media item as it entered the prompt (with return_token_ids): a trainer reproduces it from these."""

    modality: str
    grid_thw: list[int]
    content_hash: str
    frame_indices: list[int] | None = None  # videos: the decoded frames used, as the sampler picked them
    second_per_grid_t: float | None = None  # videos: seconds per temporal patch (Qwen2.5-VL's M-RoPE)


def prompt_media(images: list[Any], videos: list[Any], audios: Sequence[Any] = ()) -> list[PromptMediaOut]:
    """Images, then videos, then audio clips, each kind in prompt order (MediaItems)."""
    return [PromptMediaOut(modality=it.modality, grid_thw=list(it.grid_thw), content_hash=it.content_hash,
                           frame_indices=None if it.frame_indices is None else list(it.frame_indices),
                           second_per_grid_t=it.second_per_grid_t) for it in [*images, *videos, *audios]]


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    service_tier: str | None = None
    system_fingerprint: str | None = SYSTEM_FINGERPRINT
    usage: Usage
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    prompt_media: list[PromptMediaOut] | None = None
    weight_version: int | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None  # set on the usage chunk (SSE chunks leave nulls out)
    prompt_token_ids: list[int] | None = None
    prompt_media: list[PromptMediaOut] | None = None
    weight_version: int | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)  # None: an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None] | None = None  # the chosen token + the top k, for every k
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None
    routed_experts: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    service_tier: str | None = None
    system_fingerprint: str | None = SYSTEM_FINGERPRINT
    usage: Usage | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    weight_version: int | None = None


class ModelPermission(BaseModel):
    """OpenAI's legacy permission entry, as vLLM fills it."""
    id: str = Field(default_factory=lambda: f"modelperm-{uuid.uuid4().hex}")
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mm-infer"
    root: str
    parent: str | None = None
    max_model_len: int
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])
    weight_version: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class WeightVersion(BaseModel):
    weight_version: int


class PauseStatus(BaseModel):
    is_paused: bool
    mode: Literal["abort", "wait", "keep"] | None = None
    num_paused_requests: int | None = None  # in flight when the pause began


class UpdateWeightsResponse(BaseModel):
    success: bool = True
    message: str
    weight_version: int
    num_tensors: int
    num_buckets: int
    num_paused_requests: int


class PlaceholderOut(BaseModel):
    modality: str
    offset: int
    length: int
    frame_indices: list[int] | None = None  # videos: the decoded frames used


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None
    placeholders: list[PlaceholderOut] = Field(default_factory=list)


class DetokenizeResponse(BaseModel):
    prompt: str
