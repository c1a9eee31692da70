"""StructuredOutputsParams: the one grammar a request's output must follow (vLLM's fields and rules); no torch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class GrammarError(ValueError):
    """A structured-output spec that cannot be compiled (invalid, over the size cap, or past the compile deadline):
    the request's own fault (HTTP 400)."""

    status = 400

    def __init__(self, message: str, param: str | None = "structured_outputs") -> None:
        super().__init__(message)
        self.param = param


_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")


def check_local_refs(schema: Any) -> None:
    """Every $ref must point inside the schema ("#" or "#/..."): xgrammar 0.2.9 warns and then allows any value for
    any other reference (a remote URL, file://, a relative file, an "#anchor"), so the output would be silently
    unconstrained. Nothing is ever fetched. ValueError naming the reference and where it is."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, list):
            stack.extend((v, f"{path}/{i}") for i, v in enumerate(node))
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            where = f"{path}/{key}"
            if key in _REF_KEYS and not isinstance(value, dict):  # a dict here is a property named "$ref"
                if key != "$ref":
                    raise ValueError(f"structured outputs: {key} (at {where}) is not supported; use $ref to '#/...'")
                if not (isinstance(value, str) and (value == "#" or value.startswith("#/"))):
                    raise ValueError(f"structured outputs: the JSON schema's $ref {value!r} (at {where}) does not "
                                     "point inside the schema; only '#' and '#/...' references are supported (remote "
                                     "and file:// schemas are never fetched: put the definition under $defs)")
            stack.append((value, where))


def _token_ids(ids: Any, name: str) -> tuple[int, ...] | None:
    """A tuple of token ids (a list is accepted), or None."""
    if ids is None:
        return None
    if isinstance(ids, str | bytes) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                for t in ids):
        raise ValueError(f"structured outputs: {name} must be a list of token ids")
    return tuple(ids)


KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
GrammarKey = tuple[str, str, bool]  # (kind, canonical spec text, any_whitespace): one compiled grammar each


@dataclass
class StructuredOutputsParams:
    """Exactly one of json (a JSON schema, dict or text), regex, choice, grammar (EBNF), json_object (any JSON
    object) or structural_tag (xgrammar's structural tag, JSON text) constrains the output."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    reasoning_start_ids: tuple[int, ...] | None = None  # token ids that open a reasoning section (`<think>`)
    reasoning_end_ids: tuple[int, ...] | None = None  # token ids that close it (`</think>`): the grammar starts after

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured outputs need exactly one of " + ", ".join(KINDS) +
                             (f"; got {', '.join(given)}" if given else "; got none"))
        if self.whitespace_pattern is not None:
            raise ValueError("structured outputs: whitespace_pattern is not supported (use disable_any_whitespace)")
        self.reasoning_start_ids = _token_ids(self.reasoning_start_ids, "reasoning_start_ids")
        self.reasoning_end_ids = _token_ids(self.reasoning_end_ids, "reasoning_end_ids")
        self._check_spec()

    def _check_spec(self) -> None:
        kind, spec = self.kind, getattr(self, self.kind)
        if kind == "json" and isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError as e:
                raise ValueError(f"structured outputs: json is not a valid JSON schema text: {e}") from None
        if kind == "json" and not isinstance(spec, dict | bool):
            raise ValueError("structured outputs: json must be a JSON schema (an object)")
        if kind == "choice" and (not isinstance(spec, list) or not spec
                                 or not all(isinstance(c, str) and c for c in spec)):
            raise ValueError("structured outputs: choice must be a non-empty list of non-empty strings")
        if kind in ("regex", "grammar", "structural_tag") and (not isinstance(spec, str) or not spec):
            raise ValueError(f"structured outputs: {kind} must be a non-empty string")
        if kind == "structural_tag":
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError:
                return  # xgrammar names what is wrong with it when it compiles
        if kind in ("json", "structural_tag"):
            check_local_refs(spec)

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def key(self) -> GrammarKey:
        """What identifies the compiled grammar: equal keys share one compilation (reasoning ids are not in it: they
        gate the matcher, not the grammar)."""
        spec = getattr(self, self.kind)
        if self.kind == "json":
            spec = json.loads(spec) if isinstance(spec, str) else spec
            text = json.dumps(spec, sort_keys=True, ensure_ascii=False)
        elif self.kind == "choice":
            text = json.dumps(spec, ensure_ascii=False)
        else:
            text = "" if self.kind == "json_object" else str(spec)
        return self.kind, text, not self.disable_any_whitespace
