"""StructuredOutputsParams: the one grammar a request's output must follow (vLLM's fields and rules); no torch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

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

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured outputs need exactly one of " + ", ".join(KINDS) +
                             (f"; got {', '.join(given)}" if given else "; got none"))
        if self.whitespace_pattern is not None:
            raise ValueError("structured outputs: whitespace_pattern is not supported (use disable_any_whitespace)")
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

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def key(self) -> GrammarKey:
        """What identifies the compiled grammar: equal keys share one compilation."""
        spec = getattr(self, self.kind)
        if self.kind == "json":
            spec = json.loads(spec) if isinstance(spec, str) else spec
            text = json.dumps(spec, sort_keys=True, ensure_ascii=False)
        elif self.kind == "choice":
            text = json.dumps(spec, ensure_ascii=False)
        else:
            text = "" if self.kind == "json_object" else str(spec)
        return self.kind, text, not self.disable_any_whitespace
