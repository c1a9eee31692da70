"""Pydantic request models for the OpenAI-compatible API; unknown fields are rejected, never ignored."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class URLRef(Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None
    uuid: str | None = None


class TextPart(Strict):
    type: Literal["text", "input_text"]
    text: str


class ImageURLPart(Strict):
    type: Literal["image_url"]
    image_url: URLRef | str | None = None  # some clients send the URL as a plain string
    uuid: str | None = None


class VideoURLPart(Strict):
    type: Literal["video_url"]
    video_url: URLRef | str | None = None
    uuid: str | None = None


class InputImagePart(Strict):
    """Responses-style image part: image_url is a plain string."""

    type: Literal["input_image"]
    image_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None
    uuid: str | None = None


class InputVideoPart(Strict):
    type: Literal["input_video"]
    video_url: str | None = None
    uuid: str | None = None


ContentPart = Annotated[TextPart | ImageURLPart | VideoURLPart | InputImagePart | InputVideoPart,
                        Field(discriminator="type")]


class ToolCallFunction(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    # token ids of an earlier turn as the server returned them (NeMo RL): spliced, never re-tokenized
    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float] | None = None


class FunctionDef(Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedToolChoice(Strict):
    type: Literal["function"] = "function"
    function: dict[str, str]


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(Strict):
    """Fields shared by chat and text completions (OpenAI names, then vLLM extensions)."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=128)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = Field(default=None, ge=0)
    logprobs_mode: str | None = None
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    request_id: str | None = None
    # with --replicas: requests sharing a key go to one replica (default key: the first media hash, else the prompt)
    affinity_key: str | None = Field(default=None, max_length=256)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    mm_processor_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str | list[int]]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for text completions
    logprobs: int | None = Field(default=None, ge=0, le=20)
    add_special_tokens: bool = True


class TokenizeRequest(Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[int]


class PauseRequest(Strict):
    """abort: in-flight requests end as 503 errors; wait: they finish first; keep: they freeze until resume."""

    mode: Literal["abort", "wait", "keep"] = "abort"


class UpdateWeightsFromDiskRequest(Strict):
    model_path: str
    weight_version: int | None = None  # default: the current version + 1
    bucket_bytes: int | None = Field(default=None, ge=1)
    abort_all_requests: bool = False  # pause in mode "abort" instead of "wait" (when not paused already)
