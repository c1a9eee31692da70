"""Batched logits processing, in place on [S, V] float32: masks, logit_bias, penalties, temperature, top-k/p, min-p.

Every function runs over the rows that need it as one set of tensor ops (no per-row loop, no host sync). A row's
result depends on that row alone, and equals what the same ops give on the row by itself.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mm_infer.engine.sampling.batch import SamplingBatch

NEG_INF = float("-inf")


def unpack_bitmask(bitmask: Tensor, vocab: int) -> Tensor:
    """[G, W] int32 bitmask (bit t%32 of word t//32 set: token t allowed) -> [G, vocab] bool; ids past W*32 are not
    allowed (the lm_head may be wider than the grammar's vocab)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)  # [32]
    bits = torch.bitwise_and(torch.bitwise_right_shift(bitmask[:, :, None], shifts), 1)  # [G, W, 32]
    allowed = bits.bool().reshape(bitmask.shape[0], -1)  # [G, W*32]
    if allowed.shape[1] >= vocab:
        return allowed[:, :vocab]
    return torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)


def apply_grammar(x: Tensor, batch: SamplingBatch) -> None:
    """Tokens a row's grammar forbids next -> -inf; rows without a grammar untouched."""
    rows = batch.grammar_rows
    if not rows:
        return
    allowed = unpack_bitmask(batch.grammar_bitmask(x.shape[1]), x.shape[1])  # [G, V]
    idx = batch.index(rows)
    x[idx] = x[idx].masked_fill(allowed.logical_not(), NEG_INF)


def mask_tokens(x: Tensor, batch: SamplingBatch, never_sample: list[int], eos_ids: list[int]) -> None:
    """Pad tokens never; logit_bias added; stop and EOS ids blocked until min_tokens."""
    if never_sample:
        x[:, never_sample] = NEG_INF
    bias = [(i, tok, val) for i, s in enumerate(batch.seqs) for tok, val in (s.params.logit_bias or {}).items()]
    if bias:
        rows, toks, vals = zip(*bias, strict=True)
        x.index_put_((batch.index(list(rows)), batch.index(list(toks))), batch.tensor(list(vals), x.dtype),
                     accumulate=True)
    blocked = [(i, tok) for i, s in enumerate(batch.seqs) if s.num_output_tokens < s.params.min_tokens
               for tok in [*(s.params.stop_token_ids or []), *([] if s.params.ignore_eos else eos_ids)]]
    if blocked:
        rows, toks = zip(*blocked, strict=True)
        x[batch.index(list(rows)), batch.index(list(toks))] = NEG_INF


def apply_penalties(x: Tensor, batch: SamplingBatch) -> None:
    """vLLM semantics: repetition over prompt + output tokens, presence and frequency over output tokens."""
    rows = batch.penalty_rows
    if not rows:
        return
    idx, vocab = batch.index(rows), x.shape[1]
    sub = x[idx]  # [R, V]
    rep = batch.per_row(rows, "repetition_penalty")[:, None]  # [R, 1]; 1.0 leaves a row exactly as it was
    seen = torch.zeros(len(rows), vocab + 1, dtype=torch.bool, device=x.device)  # column `vocab` takes the padding
    seen.scatter_(1, batch.padded_ids(rows, vocab, outputs_only=False), True)
    sub = torch.where(seen[:, :vocab], torch.where(sub > 0, sub / rep, sub * rep), sub)
    outputs = batch.padded_ids(rows, vocab, outputs_only=True)  # [R, L]
    counts = torch.zeros(len(rows), vocab + 1, dtype=x.dtype, device=x.device)
    counts.scatter_add_(1, outputs, torch.ones_like(outputs, dtype=x.dtype))
    counts = counts[:, :vocab]  # [R, V]
    freq = batch.per_row(rows, "frequency_penalty")[:, None]
    presence = batch.per_row(rows, "presence_penalty")[:, None]
    sub -= freq * counts + presence * (counts > 0).to(x.dtype)
    x[idx] = sub


def apply_temperature(x: Tensor, batch: SamplingBatch) -> None:
    """Sampled rows divided by their temperature; rows at temperature 1 are left alone (x / 1 is x, bit for bit)."""
    rows = batch.scaled_rows
    if len(rows) == len(batch.seqs):  # every row scales: divide in place, no gather and scatter
        x.div_(batch.per_row(rows, "temperature")[:, None])
    elif rows:
        idx = batch.index(rows)
        x[idx] = x[idx] / batch.per_row(rows, "temperature")[:, None]


def _top_k(x: Tensor, batch: SamplingBatch) -> None:
    """Keep each row's k largest (ties at the k-th value kept)."""
    rows = batch.top_k_rows
    ks = [min(batch.seqs[i].params.top_k, x.shape[1]) for i in rows]
    idx = batch.index(rows)
    sub = x[idx]  # [R, V]
    top = torch.topk(sub, max(ks), dim=-1).values  # [R, kmax], descending
    kth = top.gather(1, batch.index([k - 1 for k in ks])[:, None])  # [R, 1]
    x[idx] = sub.masked_fill(sub < kth, NEG_INF)


def _top_p(x: Tensor, batch: SamplingBatch) -> None:
    """Keep the smallest prefix of each row's sorted distribution whose mass reaches top_p."""
    rows = batch.top_p_rows
    idx = batch.index(rows)
    sub = x[idx]  # [R, V]
    sorted_logits, order = torch.sort(sub, dim=-1, descending=True, stable=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    drop_sorted = probs.cumsum(-1) - probs > batch.per_row(rows, "top_p")[:, None]  # [R, V], sorted order
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    x[idx] = sub.masked_fill(drop, NEG_INF)


def _min_p(x: Tensor, batch: SamplingBatch) -> None:
    """Drop tokens whose probability is below min_p times the row's largest."""
    rows = batch.min_p_rows
    idx = batch.index(rows)
    sub = x[idx]
    probs = torch.softmax(sub, dim=-1)  # [R, V]
    floor = batch.per_row(rows, "min_p")[:, None] * probs.max(dim=-1, keepdim=True).values
    x[idx] = sub.masked_fill(probs < floor, NEG_INF)


def truncate(x: Tensor, batch: SamplingBatch) -> None:
    """top-k, then top-p over what top-k kept, then min-p (on temperature-scaled logits)."""
    for rows, step in ((batch.top_k_rows, _top_k), (batch.top_p_rows, _top_p), (batch.min_p_rows, _min_p)):
        if rows:
            step(x, batch)
