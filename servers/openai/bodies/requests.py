"""Request bodies of chat, completions, tokenize and the RL control routes (pydantic, with vLLM's extra fields)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from servers.openai.bodies.structured_fields import StructuredFields
from servers.openai.bodies.vllm_fields import (
    NullMeansDefault,
    OpenAIChatFields,
    VllmChatFields,
    VllmCompletionFields,
    VllmSamplingFields,
)

INT64_MAX = 2**63 - 1  # token counts past this are a 400 (past the context they are clamped to it)


class Strict(BaseModel):
    """Unknown fields and non-finite numbers (NaN, Infinity, 1e999) are a 400 naming the field."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


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


class AudioData(Strict):
    data: str
    format: str | None = None


class InputAudioPart(Strict):
    """OpenAI's audio part: base64 `data` of a `format` ("wav", "mp3", "flac"); served by models with an audio
    tower (Nemotron Omni), refused by name by the others."""

    type: Literal["input_audio"]
    input_audio: AudioData | None = None
    uuid: str | None = None


class AudioURLPart(Strict):
    type: Literal["audio_url"]
    audio_url: URLRef | str | None = None
    uuid: str | None = None


ContentPart = Annotated[TextPart | ImageURLPart | VideoURLPart | InputImagePart | InputVideoPart | InputAudioPart
                        | AudioURLPart, Field(discriminator="type")]


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
    reasoning: str | None = None  # vLLM's current name
    reasoning_content: str | None = None  # its deprecated alias
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


class StreamOptions(Strict, NullMeansDefault):
    NULL_IS_DEFAULT = frozenset({"include_usage", "continuous_usage_stats"})

    include_usage: bool = True  # vLLM's default: stream_options {} asks for the usage chunk
    continuous_usage_stats: bool = False  # with include_usage: usage so far on every chunk
    include_obfuscation: bool | None = None  # OpenAI's padding of stream chunks: none is added here


class SamplingFields(Strict, VllmSamplingFields, StructuredFields, NullMeansDefault):
    """Fields shared by chat and text completions (OpenAI names, then vLLM extensions)."""

    # vLLM types these Optional: an explicit null is the default
    NULL_IS_DEFAULT = frozenset({"n", "stream", "logprobs", "echo", "presence_penalty", "frequency_penalty",
                                 "best_of", "return_token_ids", "return_tokens_as_token_ids"})

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)
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
    top_k: int | None = Field(default=None, ge=-1, le=INT64_MAX)  # past the vocabulary: disabled
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    min_tokens: int = Field(default=0, ge=0, le=INT64_MAX)
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


class ChatCompletionRequest(SamplingFields, VllmChatFields, OpenAIChatFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, Any] | None = None  # vLLM's: {"video": {"fps": F} or {"num_frames": N}}
    best_of: int | None = None  # vLLM takes (and ignores) it here too; 1 is one sample, more is refused by name


class CompletionRequest(SamplingFields, VllmCompletionFields):
    NULL_IS_DEFAULT = SamplingFields.NULL_IS_DEFAULT | {"max_tokens"}  # vLLM: a null max_tokens is 16 here too

    prompt: str | list[int] | list[str | list[int]] | None = None  # none: a 400 naming it (vLLM's own check)
    max_tokens: int | None = Field(default=16, ge=0, le=INT64_MAX)  # OpenAI's completions default; 0 with echo only
    logprobs: int | None = Field(default=None, ge=0, le=20)
    add_special_tokens: bool = True
    best_of: int | None = None  # OpenAI's: 1 (one sample) only, see check_best_of


class TokenizeRequest(Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None  # as for chat (vLLM's tokenize request has it too)
    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[int]


PauseMode = Literal["abort", "wait", "keep"]
PAUSE_MODES = ("abort", "wait", "keep")


class PauseRequest(Strict):
    """abort: in-flight requests end as 503 errors; wait: they finish first; keep: they freeze until resume."""

    mode: PauseMode = "abort"


class UpdateWeightsFromDiskRequest(Strict):
    model_path: str
    weight_version: int | None = None  # default: the current version + 1
    bucket_bytes: int | None = Field(default=None, ge=1)
    abort_all_requests: bool = False  # pause in mode "abort" instead of "wait" (when not paused already)
    allow_nonfinite: bool = False  # load tensors holding NaN or inf (refused by default)
