"""Responses request -> equivalent chat request; finished engine output -> Responses output items and object."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from mm_infer.engine.outputs.request_output import CompletionOutput, RequestOutput
from servers.openai.answers.logprobs import chat_logprobs, json_logprobs, usage
from servers.openai.answers.parsers import Parsed
from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.replies import TokenLogprob
from servers.openai.bodies.requests import ChatCompletionRequest, FunctionDef, NamedToolChoice, Tool
from servers.openai.bodies.structured_fields import JsonSchemaSpec, ResponseFormat
from servers.openai.endpoints.chat import parse_with_span, prompt_opens_reasoning, reasoning_usage
from servers.openai.endpoints.responses_api.inputs import to_chat_messages
from servers.openai.endpoints.responses_api.objects import (
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    ReasoningContent,
    ResponseObject,
    ResponseUsage,
)
from servers.openai.endpoints.responses_api.protocol import ResponsesRequest
from servers.openai.state import ServerState


@dataclass
class ItemIds:
    """Output item ids fixed up front, so a stream's announced items and the final ones agree."""

    reasoning: str = field(default_factory=lambda: f"rs_{uuid.uuid4().hex}")
    message: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    message_announced: bool = False


LOGPROBS_INCLUDE = "message.output_text.logprobs"
SAMPLING_FIELDS = ("temperature", "top_p", "seed", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "logit_bias", "min_tokens", "ignore_eos", "stop", "stop_token_ids",
                   "skip_special_tokens", "chat_template_kwargs", "mm_processor_kwargs", "media_io_kwargs",
                   "request_id", "user", "priority", "cache_salt")


def _check_supported(req: ResponsesRequest) -> None:
    unsupported = {"previous_response_id": req.previous_response_id, "background": req.background,
                   "prompt": req.prompt, "enable_response_messages": req.enable_response_messages,
                   "previous_input_messages": req.previous_input_messages}
    for name, value in unsupported.items():
        if value:
            raise ApiError(400, f"{name} is not supported by this server's /v1/responses", param=name)
    if bad := sorted(set(req.include or []) - {LOGPROBS_INCLUDE}):
        raise ApiError(400, f"include {bad} is not supported; only {LOGPROBS_INCLUDE!r}", param="include")


def _response_format(req: ResponsesRequest) -> ResponseFormat | None:
    """Responses' flat text.format ({"type": "json_schema", "name", "schema", "strict"}) as chat's response_format."""
    fmt = (req.text or {}).get("format", {"type": "text"})
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise ApiError(400, "text.format.type must be 'text', 'json_object' or 'json_schema'", param="text.format")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat(type="json_object")
    spec = {k: v for k, v in fmt.items() if k in ("name", "description", "schema", "strict")}
    if not isinstance(spec.get("schema"), dict):
        raise ApiError(400, "text.format json_schema needs a 'schema' object", param="text.format.schema")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaSpec(**spec))


def _tool_choice(req: ResponsesRequest) -> Any:
    """Responses' named choice {"type": "function", "name": N} as chat's {"type": "function", "function": {...}}."""
    choice = req.tool_choice
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise ApiError(400, "a named tool_choice is {'type': 'function', 'name': ...}", param="tool_choice")
    return NamedToolChoice(function={"name": choice["name"]})


def to_chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The equivalent chat request: messages from the input items, the same sampling fields."""
    _check_supported(req)
    messages = to_chat_messages(req.input, req.instructions)
    if not messages:
        raise ApiError(400, "input has no message", param="input")
    logprobs = LOGPROBS_INCLUDE in (req.include or []) or req.top_logprobs is not None
    tools = [Tool(function=FunctionDef(name=t.name, description=t.description, parameters=t.parameters,
                                       strict=t.strict)) for t in req.tools] if req.tools else None
    return ChatCompletionRequest(
        messages=messages, max_tokens=req.max_output_tokens, logprobs=logprobs,
        top_logprobs=req.top_logprobs if logprobs else None, tools=tools, tool_choice=_tool_choice(req),
        response_format=_response_format(req),
        reasoning_effort=(req.reasoning or {}).get("effort"), **{name: getattr(req, name) for name in SAMPLING_FIELDS})


def output_items(parsed: Parsed, comp: CompletionOutput, prompt_token_ids: list[int],
                 logprobs: list[TokenLogprob] | None, item_ids: ItemIds | None = None) -> list[OutputItem]:
    """reasoning, then message (always one when nothing else, or when a stream announced it), then function
    calls; the turn's ids go on the last item."""
    ids = item_ids or ItemIds()
    status = "incomplete" if comp.finish_reason == "length" else "completed"
    items: list[OutputItem] = []
    if parsed.reasoning_content:
        items.append(OutputReasoning(id=ids.reasoning, content=[ReasoningContent(text=parsed.reasoning_content)],
                                     status=status))
    if parsed.content or ids.message_announced or not (items or parsed.tool_calls):
        items.append(OutputMessage(id=ids.message, status=status,
                                   content=[OutputText(text=parsed.content, logprobs=logprobs)]))
    items += [OutputFunctionCall(id=f"fc_{c.id.removeprefix('call_')}", call_id=c.id, name=c.name,
                                 arguments=c.arguments, status=status) for c in parsed.tool_calls]
    last = items[-1]
    last.prompt_token_ids = list(prompt_token_ids)
    last.generation_token_ids = list(comp.token_ids)
    last.generation_log_probs = json_logprobs(comp.logprobs)
    return items


def response_head(state: ServerState, req: ResponsesRequest, rid: str, created: int) -> ResponseObject:
    """The response without its output: what a stream announces first (status in_progress)."""
    return ResponseObject(
        id=rid, created_at=created, model=state.config.model_name, status="in_progress",
        instructions=req.instructions, max_output_tokens=req.max_output_tokens, temperature=req.temperature,
        top_p=req.top_p, top_logprobs=req.top_logprobs,
        tools=[t.model_dump(exclude_none=True) for t in req.tools or []],
        tool_choice=req.tool_choice or "auto", parallel_tool_calls=req.parallel_tool_calls is not False,
        metadata=req.metadata, user=req.user, weight_version=state.backend.weight_version)


def finish_response(state: ServerState, head: ResponseObject, chat: ChatCompletionRequest, out: RequestOutput,
                    item_ids: ItemIds | None = None, weight_version: int | None = None) -> ResponseObject:
    """head completed with the output items, usage and status of the finished request."""
    comp = out.outputs[0]
    parsed, span = parse_with_span(state, chat, comp.text, prompt_opens_reasoning(state, chat, out.prompt_token_ids))
    tok = state.preparer.tokenizer
    logprobs = chat_logprobs(tok, comp, 0, chat.top_logprobs or 0, False) if chat.logprobs else None
    prompt, generated = len(out.prompt_token_ids), len(comp.token_ids)
    details = reasoning_usage(state, chat, usage(out), [(comp, span)]).completion_tokens_details or {}
    totals = ResponseUsage(input_tokens=prompt, output_tokens=generated, total_tokens=prompt + generated,
                           input_tokens_details={"cached_tokens": out.num_cached_tokens},
                           output_tokens_details={"reasoning_tokens": details.get("reasoning_tokens", 0)})
    incomplete = comp.finish_reason == "length"
    return head.model_copy(update={
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output_items(parsed, comp, out.prompt_token_ids, logprobs, item_ids), "usage": totals,
        "weight_version": state.backend.weight_version if weight_version is None else weight_version})
