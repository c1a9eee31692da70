"""RequestOutput / CompletionOutput (vLLM shapes) and the per-token stop rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mm_infer.engine.sequence import Sequence, SequenceGroup


@dataclass
class CompletionOutput:
    """One sample: generated ids, one logprob per id, text and why it ended (None while running)."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    top_logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float = 0.0

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]  # expanded media placeholders included
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[float | None] | None = None  # each prompt token's own logprob (first: None)
    prompt_top_logprobs: list[dict[int, float] | None] | None = None  # top-k when prompt_logprobs=k > 0
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def check_stop(seq: Sequence, token: int, eos_ids: frozenset[int], max_new_tokens: int,
               decode: Any) -> tuple[str, int | str | None] | None:
    """(finish_reason, stop_reason) after `token` was appended to seq, or None to continue."""
    p = seq.params
    produced = seq.num_output_tokens
    if produced >= p.min_tokens:
        if token in eos_ids and not p.ignore_eos:
            return "stop", None
        if token in (p.stop_token_ids or ()):
            return "stop", token
        if p.stop_list:
            seq.text = decode(seq.output_token_ids, p.skip_special_tokens)
            hits = [(seq.text.find(s), s) for s in p.stop_list if s in seq.text]
            if hits:
                at, stop = min(hits)
                seq.text = seq.text[:at + len(stop)] if p.include_stop_str_in_output else seq.text[:at]
                return "stop", stop
    if produced >= max_new_tokens:
        return "length", None
    return None


def make_output(group: SequenceGroup, prompt_token_ids: list[int], prompt: str | None, decode: Any,
                metrics: RequestMetrics | None) -> RequestOutput:
    """Snapshot of a request; text is decoded here unless a stop string already fixed it."""
    outs = []
    for seq in group.seqs:
        p = seq.params
        if p.detokenize and not (seq.finish_reason == "stop" and isinstance(seq.stop_reason, str)):
            seq.text = decode(seq.output_token_ids, p.skip_special_tokens)
        outs.append(CompletionOutput(
            index=seq.index, text=seq.text if p.detokenize else "", token_ids=list(seq.output_token_ids),
            logprobs=list(seq.logprobs), finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
            top_logprobs=list(seq.top_logprobs) if p.logprobs else None,
            cumulative_logprob=float(sum(seq.logprobs))))
    first = group.seqs[0]
    scored = first.params.prompt_logprobs is not None
    return RequestOutput(
        request_id=group.request_id, prompt=prompt, prompt_token_ids=list(prompt_token_ids), outputs=outs,
        finished=group.finished, prompt_logprobs=list(first.prompt_logprobs) if scored else None,
        prompt_top_logprobs=list(first.prompt_top_logprobs) if first.params.prompt_logprobs else None,
        metrics=metrics, num_cached_tokens=min(s.num_cached_tokens for s in group.seqs))
