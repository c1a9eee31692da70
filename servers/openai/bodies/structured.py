"""Structured-output request fields (response_format, structured_outputs, vLLM's guided_*, a forced tool_choice)
to the one StructuredOutputsParams of a request."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mm_infer.structured.params import KINDS, StructuredOutputsParams
from servers.openai.answers.parsers import HermesToolParser, OutputParser
from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.requests import SamplingFields, Tool
from servers.openai.bodies.structured_fields import ResponseFormat, StructuredOutputsRequest

if TYPE_CHECKING:
    from mm_infer.engine.sampling.params import SamplingParams

TOOL_CALL_BEGIN, TOOL_CALL_END = "<tool_call>\n", "\n</tool_call>"  # what outputs.HermesToolParser reads


def forced_tools(req: SamplingFields) -> list[Tool] | None:
    """The tools a tool_choice of "required" (any of them) or a named function (that one) forces, else None."""
    choice, tools = getattr(req, "tool_choice", None), getattr(req, "tools", None) or []
    if choice == "required":
        return tools
    if choice is not None and not isinstance(choice, str):
        return [t for t in tools if t.function.name == choice.function.get("name")]
    return None


def request_parser(parser: OutputParser, req: SamplingFields) -> OutputParser:
    """The server's parsers for this request; a forced tool_choice's calls (hermes markup the grammar wrote) are
    parsed as tool_calls whatever --tool-parser says."""
    return parser if forced_tools(req) is None else OutputParser(parser.reasoning, HermesToolParser())


def _tool_tag(tool: Tool, max_whitespace: int | None) -> dict[str, Any]:
    """One hermes call: fixed text around the JSON arguments the function's parameters schema allows."""
    params = tool.function.parameters or {"type": "object", "properties": {}}
    begin = TOOL_CALL_BEGIN + '{"name": ' + json.dumps(tool.function.name, ensure_ascii=False) + ', "arguments": '
    return {"type": "tag", "begin": begin, "end": "}" + TOOL_CALL_END,
            "content": {"type": "json_schema", "json_schema": params, "max_whitespace_cnt": max_whitespace}}


def tool_call_tag(req: SamplingFields, tools: list[Tool], compact: bool) -> str:
    """xgrammar structural tag (JSON text) for the forced calls: one call of a named function; for "required", one
    or more calls of any tool (one only when parallel_tool_calls is false)."""
    tags = [_tool_tag(t, 1 if compact else None) for t in tools]
    if getattr(req, "tool_choice", None) != "required":
        fmt: dict[str, Any] = tags[0]
    else:
        fmt = {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True,
               "stop_after_first": getattr(req, "parallel_tool_calls", None) is False}
    return json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)


def _response_format(fmt: ResponseFormat | None) -> tuple[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return "json_object", True
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ApiError(400, "response_format of type json_schema needs json_schema.schema", param="response_format")
    return "json", fmt.json_schema.schema_


OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")


def _constraints(req: SamplingFields, given: StructuredOutputsRequest) -> list[tuple[str, str, Any]]:
    """(request field, kind, spec) of every constraint the request gives."""
    body = given.model_dump(by_alias=True)
    found = [("structured_outputs", k, body[k]) for k in KINDS if body[k] not in (None, False)]
    if (fmt := _response_format(getattr(req, "response_format", None))) is not None:
        found.append(("response_format", *fmt))
    for kind in ("json", "regex", "choice", "grammar"):
        if (value := getattr(req, f"guided_{kind}", None)) is not None:
            found.append((f"guided_{kind}", kind, value))
    if (tools := forced_tools(req)) is not None:
        found.append(("tool_choice", "structural_tag", tool_call_tag(req, tools, given.disable_any_whitespace)))
    return found


def structured_outputs_params(req: SamplingFields) -> StructuredOutputsParams | None:
    """The request's one output constraint, or None; two constraints, or a malformed one, are a 400."""
    given = getattr(req, "structured_outputs", None)
    found = _constraints(req, given or StructuredOutputsRequest())
    if not found:
        if given is not None:
            raise ApiError(400, "structured_outputs needs one of " + ", ".join(KINDS), param="structured_outputs")
        return None
    if len(found) > 1:
        raise ApiError(400, "only one output constraint per request; got " + " and ".join(
            f"{field} ({kind})" for field, kind, _ in found), param=found[1][0])
    field, kind, spec = found[0]
    options = {k: getattr(given, k) for k in OPTIONS} if given is not None else {}
    try:
        return StructuredOutputsParams(**{kind: spec}, **options)
    except ValueError as e:
        raise ApiError(400, str(e), param=field) from None


def _single_token(tokenizer: Any, tag: str) -> int | None:
    """The tag's token id when it is one token of the vocabulary (vLLM's reasoning parsers need that), else None."""
    tid = tokenizer.convert_tokens_to_ids(tag)
    return None if tid is None or tid == getattr(tokenizer, "unk_token_id", None) else int(tid)


def reasoning_tag_ids(parser: OutputParser, tokenizer: Any) -> tuple[int, int] | None:
    """(start id, end id) of the server's reasoning tags, or None: no reasoning parser, or a tag that is not one
    token of this checkpoint (then the grammar applies from token 0, as without a parser)."""
    if parser.reasoning is None:
        return None
    start, end = _single_token(tokenizer, parser.reasoning.start), _single_token(tokenizer, parser.reasoning.end)
    return None if start is None or end is None else (start, end)


def grammar_after_reasoning(params: SamplingParams, parser: OutputParser, tokenizer: Any) -> SamplingParams:
    """params whose grammar starts after the reasoning end token when a reasoning parser is on (vLLM's structured
    output manager with a reasoner): the engine leaves the tokens up to `</think>` unconstrained, or applies the
    grammar from token 0 when the prompt's last reasoning tag is `</think>`. Other params are returned as they are."""
    spec = params.structured_outputs
    if spec is None or spec.reasoning_end_ids is not None or (ids := reasoning_tag_ids(parser, tokenizer)) is None:
        return params
    spec = replace(spec, reasoning_start_ids=(ids[0],), reasoning_end_ids=(ids[1],))
    return replace(params, structured_outputs=spec)
