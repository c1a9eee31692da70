"""Pydantic models of a /v1/responses answer: output items (reasoning, message, function_call) and usage."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from servers.openai.bodies.replies import TokenLogprob


class OutputTokenFields(BaseModel):
    """Set on a response's last output item only: that turn's exact ids, to send back with the item."""

    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float] | None = None


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None


class OutputMessage(OutputTokenFields):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["completed", "incomplete"]
    content: list[OutputText]


class ReasoningContent(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(OutputTokenFields):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningContent]
    status: Literal["completed", "incomplete"]


class OutputFunctionCall(OutputTokenFields):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["completed", "incomplete"]


OutputItem = OutputMessage | OutputReasoning | OutputFunctionCall


class ResponseUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens_details: dict[str, int]


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    model: str
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    incomplete_details: dict[str, str] | None = None
    error: dict[str, Any] | None = None
    output: list[OutputItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    metadata: dict[str, str] | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    truncation: str = "disabled"
    store: bool = False
    user: str | None = None
    weight_version: int
