"""The grammar of a request's tool calls, as vLLM 0.32's hermes structural tag writes it: which tools a tool_choice
forces, how strictly their arguments are held (`--tool-strict-level`, each tool's `strict`), and the parser that
reads the calls back."""

from __future__ import annotations

import json
from enum import IntEnum
from typing import Any

from servers.openai.answers.parsers import HermesToolParser, OutputParser
from servers.openai.bodies.requests import SamplingFields, Tool

CALL_START, CALL_END = "<tool_call>", "</tool_call>"  # what answers.parsers.HermesToolParser reads
# the two envelopes a hermes call may take: tags on lines of their own, or tight around the JSON
ENVELOPES = ((CALL_START + "\n", "\n" + CALL_END), (CALL_START, CALL_END))


class ToolStrictLevel(IntEnum):
    """Server floor for the tool-call grammar (vLLM's --tool-strict-level).

    AUTO: a forced tool_choice fixes the call envelope; arguments follow a tool's schema only when the tool says
    `strict: true`, and tool_choice "auto" is constrained only when some tool is strict.
    FUNCTION: the envelope is constrained for every request with tools, "auto" included.
    PARAMETER: besides, every tool's arguments follow its schema, as if each were strict."""

    AUTO = 0
    FUNCTION = 1
    PARAMETER = 2

    @classmethod
    def named(cls, name: str) -> ToolStrictLevel:
        try:
            return cls[name.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown tool strict level {name!r}; expected auto, function or parameter") from None


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


def _arguments_schema(tool: Tool, level: ToolStrictLevel) -> dict[str, Any] | bool:
    """The arguments' JSON schema: the tool's parameters when it is held strictly, else any JSON value (True)."""
    strict = level >= ToolStrictLevel.PARAMETER or tool.function.strict is True
    if not strict or tool.function.parameters is None:
        return True
    return tool.function.parameters


def _tool_tags(tool: Tool, level: ToolStrictLevel, max_whitespace: int | None) -> list[dict[str, Any]]:
    """One call of the tool in either envelope: fixed text around the JSON arguments."""
    name = json.dumps(tool.function.name, ensure_ascii=False)
    content = {"type": "json_schema", "json_schema": _arguments_schema(tool, level),
               "max_whitespace_cnt": max_whitespace}
    return [{"type": "tag", "begin": begin + '{"name": ' + name + ', "arguments": ', "content": content,
             "end": "}" + end} for begin, end in ENVELOPES]


def _applies(req: SamplingFields, level: ToolStrictLevel | None, other_constraint: bool) -> bool:
    """Whether the request's tool calls get a grammar: always when forced; for "auto", only with a tool parser,
    no other output constraint, and a strict tool or a level (or parallel_tool_calls false) asking for one."""
    tools, choice = getattr(req, "tools", None), getattr(req, "tool_choice", None)
    if not tools or choice == "none":
        return False
    if forced_tools(req) is not None:
        return True
    if level is None or other_constraint:
        return False
    single = getattr(req, "parallel_tool_calls", None) is False
    return level >= ToolStrictLevel.FUNCTION or single or any(t.function.strict is True for t in tools)


def tool_call_tag(req: SamplingFields, level: ToolStrictLevel | None, compact: bool,
                  other_constraint: bool) -> str | None:
    """xgrammar structural tag (JSON text) for the request's tool calls, or None: one call of a named function;
    for "required", one or more calls of any tool; for "auto", free text until a `<tool_call>` opens a call. With
    parallel_tool_calls false, one call at most. `level` is None when the server has no tool parser."""
    if not _applies(req, level, other_constraint):
        return None
    forced = forced_tools(req)
    level = level or ToolStrictLevel.AUTO
    tags = [tag for t in (forced if forced is not None else req.tools)  # type: ignore[attr-defined]
            for tag in _tool_tags(t, level, 1 if compact else None)]
    single = getattr(req, "parallel_tool_calls", None) is False
    choice = getattr(req, "tool_choice", None)
    if forced is None:
        fmt: dict[str, Any] = {"type": "triggered_tags", "triggers": [CALL_START], "tags": tags,
                               "at_least_one": False, "stop_after_first": single}
    else:
        fmt = {"type": "tags_with_separator", "tags": tags, "separator": "", "at_least_one": True,
               "stop_after_first": single or choice != "required"}
    return json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)
