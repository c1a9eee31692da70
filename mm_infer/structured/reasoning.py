"""Structured outputs under a reasoning parser: the grammar is held off until the sample's reasoning ends (vLLM)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mm_infer.structured.params import StructuredOutputsParams


def reasoning_ended(token_ids: Sequence[int], start_ids: Sequence[int], end_ids: Sequence[int]) -> bool:
    """vLLM's `is_reasoning_end`: scanning back, the last reasoning tag is an end tag (a prompt that closed its think
    block, e.g. `enable_thinking=False`); a start tag after it, or no tag at all, leaves the reasoning open."""
    start, end = set(start_ids), set(end_ids)
    for token in reversed(token_ids):
        if token in end:
            return True
        if token in start:
            return False
    return False


class ReasoningGate:
    """A sample's grammar matcher that sees nothing while the sample reasons: its tokens are unmasked and not fed
    to the matcher; the end token itself is not either (vLLM's `should_advance`), the grammar constrains every
    token after it."""

    __slots__ = ("end_ids", "ended", "matcher")

    def __init__(self, matcher: Any, end_ids: frozenset[int], ended: bool = False) -> None:
        self.matcher = matcher
        self.end_ids = end_ids
        self.ended = ended

    @property
    def masking(self) -> Any:
        """The matcher that masks the next token, or None while the reasoning is open."""
        return self.matcher if self.ended else None

    def accept_token(self, token: int) -> bool:
        if self.ended:
            return self.matcher.accept_token(token)
        self.ended = token in self.end_ids
        return True

    def is_terminated(self) -> bool:
        return self.ended and self.matcher.is_terminated()


def gate_matcher(matcher: Any, spec: StructuredOutputsParams | None, prompt_token_ids: Sequence[int]) -> Any:
    """The matcher a sample uses: gated while its reasoning is open when the spec names reasoning end ids, else the
    matcher itself (no reasoning parser, or the prompt already ended the reasoning: the grammar applies at once)."""
    if matcher is None or spec is None or not spec.reasoning_end_ids:
        return matcher
    if reasoning_ended(prompt_token_ids, spec.reasoning_start_ids or (), spec.reasoning_end_ids):
        return matcher
    return ReasoningGate(matcher, frozenset(spec.reasoning_end_ids))
