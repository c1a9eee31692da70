"""RequestOutput / CompletionOutput (vLLM shapes), built per the request's output kind: cumulative, delta or final."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mm_infer.engine.errors import RequestError
from mm_infer.engine.outputs.detokenizer import Decode
from mm_infer.engine.sampling.params import RequestOutputKind
from mm_infer.engine.scheduling.sequence import RequestMetrics, Sequence, SequenceGroup

__all__ = ["CompletionOutput", "RequestMetrics", "RequestOutput", "make_output", "merge_delta"]


@dataclass
class CompletionOutput:
    """One sample: generated ids, one logprob per id, text and why it ended (None while running).

    In a DELTA output the lists and the text hold only what is new since the request's previous output."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None
    top_logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float = 0.0
    # R3, on the finished output only: [prompt + generated - 1 - routed_experts_prompt_start, layers, top_k] expert
    # ids (uint8, uint16 above 256 experts), row p the routing of the token at position prompt_start + p
    routed_experts: np.ndarray | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]  # expanded media placeholders included (shared with the request: do not mutate)
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[float | None] | None = None  # each prompt token's own logprob (first: None)
    prompt_top_logprobs: list[dict[int, float] | None] | None = None  # top-k when prompt_logprobs=k > 0
    prompt_ranks: list[int | None] | None = None  # each prompt token's rank (1: the most likely; first: None)
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    error: RequestError | None = None  # set when the engine failed this request (finish_reason "error")


def _held_back(seq: Sequence) -> int:
    """Characters a running sample keeps back: the start of a stop string to be cut may be forming there."""
    p = seq.params
    return max(len(s) for s in p.stop_list) - 1 if p.stop_list and not p.include_stop_str_in_output else 0


def _finish_text(seq: Sequence, decode: Decode) -> str:
    """The sample's whole text, decoded once when it ends (a stop string may already have fixed it). As vLLM, the
    token that ended it (EOS, a stop token id) is in its token ids but its text is not, unless
    include_stop_str_in_output; and a sample that ends inside a multi-byte character leaves that partial character
    out (vLLM's detokenizer never emits a text ending in U+FFFD: it waits for bytes that never come)."""
    if seq.final_text is None:
        ids = seq.output_token_ids
        if seq.stop_terminated and not seq.params.include_stop_str_in_output:
            ids = ids[:-1]
        seq.final_text = decode(ids, seq.params.skip_special_tokens).rstrip("\ufffd")
    return seq.final_text


def _text(seq: Sequence, delta: bool, decode: Decode) -> str:
    if not seq.params.detokenize:
        return ""
    if seq.is_finished:
        text = _finish_text(seq, decode)
        return text[seq.emitted_chars:] if delta else text
    if seq.detok is None:
        return ""
    committed = seq.detok.committed
    visible = max(committed.length - _held_back(seq), seq.emitted_chars)
    if not delta:
        return committed.value()[:visible]
    return committed.since(seq.emitted_chars)[:visible - seq.emitted_chars]


def _routing(seq: Sequence) -> np.ndarray | None:
    """A finished sample's routing rows, as vLLM returns them: every forwarded token from the prompt start on (the
    last sampled token never was one)."""
    if seq.routing is None or seq.routing.data is None:
        return None
    start = min(seq.params.routed_experts_prompt_start, seq.num_prompt_tokens)
    return seq.routing.rows(start, len(seq) - 1)


def sample_output(seq: Sequence, kind: RequestOutputKind, decode: Decode) -> CompletionOutput:
    """One sample's output: all of it, or (DELTA) only what was not sent before."""
    p = seq.params
    delta = kind is RequestOutputKind.DELTA
    start = seq.emitted_tokens if delta else 0
    text = _text(seq, delta, decode)
    ids = seq.output_token_ids if start == 0 else seq.token_ids[seq.num_prompt_tokens + start:]
    out = CompletionOutput(
        index=seq.index, text=text, token_ids=ids, logprobs=seq.logprobs[start:],
        finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
        top_logprobs=seq.top_logprobs[start:] if p.logprobs else None,
        cumulative_logprob=float(sum(seq.logprobs)) if seq.is_finished else seq.cumulative_logprob,
        routed_experts=_routing(seq) if seq.is_finished else None)
    if delta:
        seq.emitted_tokens += len(ids)
        seq.emitted_chars += len(text)
    return out


def make_output(group: SequenceGroup, decode: Decode) -> RequestOutput:
    """The request's output now, per its output kind (FINAL_ONLY requests are asked only when finished)."""
    kind = group.params.output_kind
    outs = [sample_output(seq, kind, decode) for seq in group.seqs]
    first = group.seqs[0]
    req = group.request
    scored = first.params.prompt_logprobs is not None
    return RequestOutput(
        request_id=group.request_id, prompt=req.prompt_text, prompt_token_ids=req.prompt_token_ids, outputs=outs,
        finished=group.finished, prompt_logprobs=list(first.prompt_logprobs) if scored else None,
        prompt_top_logprobs=list(first.prompt_top_logprobs) if first.params.prompt_logprobs else None,
        prompt_ranks=list(first.prompt_ranks) if scored else None,
        metrics=group.metrics, num_cached_tokens=min(s.num_cached_tokens for s in group.seqs), error=group.error)


def merge_delta(older: RequestOutput, newer: RequestOutput) -> RequestOutput:
    """Two consecutive DELTA outputs of one request as one: each sample's new ids, logprobs, top-k and text
    joined; the newer output's state (finish reasons, metrics, cached tokens, error)."""
    mine = {c.index: c for c in older.outputs}
    outputs = []
    for c in newer.outputs:
        o = mine.pop(c.index, None)
        if o is not None:
            top = None if c.top_logprobs is None else [*(o.top_logprobs or []), *c.top_logprobs]
            c = CompletionOutput(c.index, o.text + c.text, [*o.token_ids, *c.token_ids], [*o.logprobs, *c.logprobs],
                                 c.finish_reason, c.stop_reason, top, c.cumulative_logprob, c.routed_experts)
        outputs.append(c)
    outputs.extend(mine.values())  # samples the newer output does not carry
    outputs.sort(key=lambda c: c.index)
    return replace(newer, outputs=outputs, prompt_logprobs=older.prompt_logprobs or newer.prompt_logprobs,
                   prompt_top_logprobs=older.prompt_top_logprobs or newer.prompt_top_logprobs,
                   prompt_ranks=older.prompt_ranks or newer.prompt_ranks)


class OutputAccumulator:
    """Collects a request's DELTA outputs; `whole()` assembles the cumulative output once, on demand."""

    def __init__(self) -> None:
        self.last: RequestOutput | None = None
        self._samples: dict[int, tuple[list[int], list[float], list[dict[int, float]], list[str]]] = {}
        self._ends: dict[int, CompletionOutput] = {}

    def add(self, delta: RequestOutput) -> RequestOutput:
        for c in delta.outputs:
            ids, lps, tops, text = self._samples.setdefault(c.index, ([], [], [], []))
            ids += c.token_ids
            lps += c.logprobs
            tops += c.top_logprobs or []
            text.append(c.text)
            self._ends[c.index] = c
        self.last = delta
        return delta

    def num_generated(self) -> int:
        return sum(len(ids) for ids, _, _, _ in self._samples.values())

    def whole(self) -> RequestOutput | None:
        if self.last is None:
            return None
        outputs = []
        for index in sorted(self._samples):
            ids, lps, tops, text = self._samples[index]
            end = self._ends[index]
            outputs.append(CompletionOutput(index, "".join(text), list(ids), list(lps), end.finish_reason,
                                            end.stop_reason, list(tops) if end.top_logprobs is not None else None,
                                            end.cumulative_logprob, end.routed_experts))
        return RequestOutput(**{**self.last.__dict__, "outputs": outputs})
