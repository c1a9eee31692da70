"""Pydantic request models for POST /v1/responses: input items (OpenAI names) plus the RL token fields."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from servers.openai.bodies.requests import InputAudioPart, InputImagePart, InputVideoPart, Strict
from servers.openai.bodies.vllm_fields import NullMeansDefault


class TokenFields(Strict):
    """An earlier turn's exact ids as the server returned them on its last output item (NeMo RL names)."""

    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float] | None = None


class TextItemPart(Strict):
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class RefusalPart(Strict):
    type: Literal["refusal"]
    refusal: str


ItemPart = Annotated[TextItemPart | RefusalPart | InputImagePart | InputVideoPart | InputAudioPart,
                     Field(discriminator="type")]


class MessageItem(TokenFields):
    type: Literal["message"] = "message"
    id: str | None = None
    status: str | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ItemPart]


class ReasoningText(Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(TokenFields):
    type: Literal["reasoning"]
    id: str | None = None
    status: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None


class FunctionCallItem(TokenFields):
    type: Literal["function_call"]
    id: str | None = None
    status: str | None = None
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    id: str | None = None
    status: str | None = None
    call_id: str
    output: str


def _message_by_default(item: Any) -> Any:
    """EasyInputMessage ({"role", "content"} without "type") is a message item."""
    if isinstance(item, dict) and "type" not in item and "role" in item:
        return {**item, "type": "message"}
    return item


InputItem = Annotated[
    Annotated[MessageItem | ReasoningItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")],
    BeforeValidator(_message_by_default)]
AssistantItem = MessageItem | ReasoningItem | FunctionCallItem


class FunctionTool(Strict):
    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesStreamOptions(Strict):
    include_obfuscation: bool | None = None  # OpenAI's padding of stream events: none is added here


class ResponsesRequest(Strict, NullMeansDefault):
    """OpenAI fields, then the vLLM-style sampling extensions the chat endpoint also takes."""

    NULL_IS_DEFAULT = frozenset({"stream", "presence_penalty", "frequency_penalty"})  # as for chat

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    include: list[str] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    prompt_cache_key: str | None = None  # a cache-routing hint; the prefix cache needs none
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    safety_identifier: str | None = None  # an end-user id for abuse tracking, like user
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None  # "auto" behaves as "disabled", as in vLLM
    max_tool_calls: int | None = Field(default=None, ge=0)  # built-in tools only: there are none here
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None  # one tier here
    prompt: dict[str, Any] | None = None  # stored prompt templates: a 400, as in vLLM
    priority: int = 0  # vLLM's extensions, as for chat
    cache_salt: str | None = None
    enable_response_messages: bool = False  # vLLM: gpt-oss (harmony) only
    previous_input_messages: list[Any] | None = None  # vLLM: harmony only
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, Any] | None = None
    request_id: str | None = None
