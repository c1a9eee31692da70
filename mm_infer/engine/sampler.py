"""Sampler: logits processing (bias, masks, penalties, temperature, top-k/p, min-p), seeded draws, logprobs."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch
from torch import Tensor

from mm_infer.engine.sequence import Sequence


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]  # of the sampled token, per logprobs_mode
    top_logprobs: list[dict[int, float] | None]


def _apply_penalties(row: Tensor, seq: Sequence) -> None:
    """In place on row [V], vLLM semantics: repetition over prompt+output, presence/frequency over output."""
    p = seq.params
    vocab = row.shape[0]
    if p.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=row.device)
        seen[torch.tensor(seq.token_ids, device=row.device)] = True
        row[seen] = torch.where(row[seen] > 0, row[seen] / p.repetition_penalty, row[seen] * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and seq.num_output_tokens:
        counts = torch.bincount(torch.tensor(seq.output_token_ids, device=row.device), minlength=vocab)[:vocab]
        row -= p.frequency_penalty * counts.to(row.dtype) + p.presence_penalty * (counts > 0).to(row.dtype)


def _truncate(row: Tensor, top_k: int, top_p: float, min_p: float) -> None:
    """In place on temperature-scaled row [V]: mask tokens outside top-k, the top-p nucleus, or below min-p."""
    if top_k and top_k < row.shape[0]:
        kth = torch.topk(row, top_k).values[-1]
        row[row < kth] = float("-inf")
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix reaching top_p
        row[order[drop]] = float("-inf")
    if min_p > 0.0:
        probs = torch.softmax(row, dim=-1)
        row[probs < min_p * probs.max()] = float("-inf")


class Sampler:
    """One row per sequence; every random draw uses the sequence's own generator (batch-independent)."""

    def __init__(self, never_sample: Seq[int], eos_ids: Seq[int]) -> None:
        self.never_sample = list(never_sample)
        self.eos_ids = list(eos_ids)

    def _process(self, logits: Tensor, seqs: list[Sequence]) -> Tensor:
        """Processed logits [S, V]: pad mask, logit_bias, min_tokens, penalties, temperature, truncation."""
        x = logits.clone()
        if self.never_sample:
            x[:, self.never_sample] = float("-inf")
        bias = [(i, tok, val) for i, s in enumerate(seqs) for tok, val in (s.params.logit_bias or {}).items()]
        if bias:
            rows, toks, vals = zip(*bias, strict=True)
            x.index_put_((torch.tensor(rows), torch.tensor(toks)), torch.tensor(vals, dtype=x.dtype), accumulate=True)
        blocked = [(i, tok) for i, s in enumerate(seqs) if s.num_output_tokens < s.params.min_tokens
                   for tok in [*(s.params.stop_token_ids or []), *([] if s.params.ignore_eos else self.eos_ids)]]
        if blocked:
            rows, toks = zip(*blocked, strict=True)
            x[torch.tensor(rows), torch.tensor(toks)] = float("-inf")
        for i, seq in enumerate(seqs):
            p = seq.params
            if p.has_penalties:
                _apply_penalties(x[i], seq)
            if not p.greedy:
                x[i] /= p.temperature
                if p.top_k or p.top_p < 1.0 or p.min_p > 0.0:
                    _truncate(x[i], p.top_k, p.top_p, p.min_p)
        return x

    def __call__(self, logits: Tensor, seqs: list[Sequence]) -> SampleResult:
        """logits [S, V] float32, one row per sequence."""
        raw = torch.log_softmax(logits, dim=-1)  # [S, V]
        x = self._process(logits, seqs)
        need_processed = [not s.params.greedy or s.params.logprobs_mode == "processed_logprobs" for s in seqs]
        processed = torch.log_softmax(x, dim=-1) if any(need_processed) else raw  # [S, V]
        tokens = torch.argmax(x, dim=-1)  # [S], greedy rows keep this
        rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if rows:  # inverse-CDF draw: one uniform per row from that sequence's generator
            cdf = torch.cumsum(processed[rows].exp(), dim=-1)  # [R, V], row-wise scan
            u = torch.cat([torch.rand(1, generator=seqs[i].generator) for i in rows])  # [R]
            target = (1.0 - u)[:, None] * cdf[:, -1:]  # in (0, total]
            drawn = torch.searchsorted(cdf, target)[:, 0].clamp_(max=cdf.shape[1] - 1)
            tokens[rows] = drawn
        use_processed = torch.tensor([s.params.logprobs_mode == "processed_logprobs" for s in seqs])
        source = torch.where(use_processed[:, None], processed, raw) if bool(use_processed.any()) else raw
        picked = source.gather(1, tokens[:, None])[:, 0]  # [S]
        result = SampleResult(tokens.tolist(), picked.tolist(), [None] * len(seqs))
        for i, seq in enumerate(seqs):
            if seq.params.logprobs:
                values, idx = torch.topk(source[i], seq.params.logprobs)
                result.top_logprobs[i] = dict(zip(idx.tolist(), values.tolist(), strict=True))
        return result
