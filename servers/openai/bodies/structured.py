"""Structured-output request fields (response_format, structured_outputs, vLLM's guided_*, a forced tool_choice)
to the one StructuredOutputsParams of a request."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mm_infer.structured.params import KINDS, StructuredOutputsParams
from servers.openai.answers.parsers import OutputParser
from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.requests import SamplingFields
from servers.openai.bodies.structured_fields import ResponseFormat, StructuredOutputsRequest
from servers.openai.bodies.tool_grammar import ToolStrictLevel, tool_call_tag

if TYPE_CHECKING:
    from mm_infer.engine.sampling.params import SamplingParams

def _response_format(fmt: ResponseFormat | None) -> tuple[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return "json_object", True
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ApiError(400, "response_format of type json_schema needs json_schema.schema", param="response_format")
    return "json", fmt.json_schema.schema_


OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")


def _constraints(req: SamplingFields, given: StructuredOutputsRequest,
                 tool_level: ToolStrictLevel | None) -> list[tuple[str, str, Any]]:
    """(request field, kind, spec) of every constraint the request gives (its tool calls' grammar included)."""
    body = given.model_dump(by_alias=True)
    found = [("structured_outputs", k, body[k]) for k in KINDS if body[k] not in (None, False)]
    if (fmt := _response_format(getattr(req, "response_format", None))) is not None:
        found.append(("response_format", *fmt))
    for kind in ("json", "regex", "choice", "grammar"):
        if (value := getattr(req, f"guided_{kind}", None)) is not None:
            found.append((f"guided_{kind}", kind, value))
    if (tag := tool_call_tag(req, tool_level, given.disable_any_whitespace, bool(found))) is not None:
        found.append(("tool_choice", "structural_tag", tag))
    return found


def structured_outputs_params(req: SamplingFields,
                              tool_level: ToolStrictLevel | None = None) -> StructuredOutputsParams | None:
    """The request's one output constraint, or None; two constraints, or a malformed one, are a 400. tool_level is
    the server's tool strict level, None without a tool parser (tool_choice "auto" is then never constrained)."""
    given = getattr(req, "structured_outputs", None)
    found = _constraints(req, given or StructuredOutputsRequest(), tool_level)
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
