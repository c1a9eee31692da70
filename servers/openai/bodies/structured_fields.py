"""Structured-output request fields: response_format, vLLM's structured_outputs and guided_* (pydantic bodies)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


class JsonSchemaSpec(BaseModel):
    """OpenAI's response_format.json_schema; `strict` is accepted: the schema is always enforced."""

    model_config = _STRICT
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StructuredOutputsRequest(BaseModel):
    """vLLM's `structured_outputs` body field: one constraint, plus options that also apply to response_format and a
    forced tool_choice."""

    model_config = _STRICT
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


class StructuredFields(BaseModel):
    """The request fields that constrain the output (chat and completions)."""

    model_config = _STRICT
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: dict[str, Any] | str | None = None  # vLLM's older names for the structured_outputs kinds
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
