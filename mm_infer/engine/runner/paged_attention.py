"""PagedAttentionContext: the engine's AttentionContext, writing K/V into paged blocks, attending per sequence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

import mm_infer_kernels.dispatch as K
from mm_infer.models.attention import causal_attention_batch

# Decode keys are padded to a multiple of this (rounded up to whole blocks): the padded length is a function of
# the sequence alone, so grouping sequences of one bucket into one bmm cannot change any sequence's numbers.
DECODE_BUCKET = 64


@dataclass
class KVCache:
    """Per-layer key/value slots, head-major so that a gather yields [Hkv, ctx, d]: [layers, Hkv, slots, d]."""

    k: Tensor
    v: Tensor
    block_size: int

    @staticmethod
    def allocate(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> KVCache:
        shape = (num_layers, num_kv_heads, num_blocks * block_size, head_dim)
        return KVCache(torch.zeros(shape, dtype=dtype, device=device),
                       torch.zeros(shape, dtype=dtype, device=device), block_size)

    def clear_blocks(self, blocks: Tensor) -> None:
        """Zero whole blocks ([n] long ids) in every layer: a block's earlier owner may have left anything in it
        (NaN included), and a masked read multiplies what it reads by zero, which keeps a NaN a NaN."""
        for cache in (self.k, self.v):
            layers, heads, _, d = cache.shape
            cache.view(layers, heads, -1, self.block_size, d).index_fill_(2, blocks, 0)


@dataclass
class SeqSpan:
    """One sequence: its queries [q_start, q_start+q_len) in the flat batch, its context in the gathered keys."""

    q_start: int
    q_len: int
    ctx_start: int
    ctx_len: int  # the last q_len context positions are this step's tokens


@dataclass
class DecodeGroup:
    """Single-query sequences whose contexts pad to the same length: one gather and two bmm's per layer."""

    rows: Tensor  # [G] long, their rows in the flat batch
    slots: Tensor  # [G * Lpad] long, context slots padded with the zero slot (a slot nothing ever writes)
    pad: Tensor  # [G, Lpad] bool, True on padding

    @staticmethod
    def bucket(ctx_len: int, block_size: int) -> int:
        unit = -(-DECODE_BUCKET // block_size) * block_size
        return -(-ctx_len // unit) * unit


def decode_attention(q: Tensor, keys: Tensor, values: Tensor, pad: Tensor) -> Tensor:
    """q [G, Hq, d], keys/values [Hkv, G*Lpad, d] (as gathered, head-major), pad [G, Lpad] -> [G, Hq, d].

    bmm is batch-count invariant and softmax is row-invariant on CPU, so each row depends only on its
    own sequence and its padded length (masked keys add exact zeros). Padding must gather a slot that holds zeros
    (the runner's zero block): its probability is 0, and 0 x NaN would poison the row.
    """
    g, hq, d = q.shape
    hkv, lpad = keys.shape[0], pad.shape[1]
    rep = hq // hkv
    qh = (q * d**-0.5).view(g, hkv, rep, d).transpose(0, 1).reshape(hkv * g, rep, d)  # [Hkv*G, R, d]
    scores = torch.bmm(qh, keys.view(hkv * g, lpad, d).transpose(1, 2))  # [Hkv*G, R, Lpad]
    scores = scores.view(hkv, g, rep, lpad).masked_fill(pad[None, :, None, :], float("-inf"))
    probs = torch.softmax(scores.view(hkv * g, rep, lpad), dim=-1)
    out = torch.bmm(probs, values.view(hkv * g, lpad, d))  # [Hkv*G, R, d]
    return out.view(hkv, g, rep, d).transpose(0, 1).reshape(g, hq, d)


@dataclass
class PrefillTables:
    """Device metadata of the multi-token chunks for the paged prefill kernel (mm_infer_kernels/paged_prefill.py)."""

    tables: Tensor  # [C, blocks] int32 block tables
    q_starts: Tensor  # [C] long: each chunk's first row in the flat batch
    q_lens: Tensor  # [C] long
    ctx_lens: Tensor  # [C] long: keys in the cache, the chunk's own included
    max_q: int  # the longest chunk (host int: the launch needs no device read)


class PagedAttentionContext:
    """Writes this step's K/V to their slots (all sequences first), then attends: single-query sequences in
    length buckets, longer chunks one sequence at a time with causal SDPA, or all in one paged prefill kernel
    launch when `prefill` is given (Triton backends: CUDA, or MM_INFER_KERNELS=triton).

    Rows past the real tokens (padding for row-invariant matmuls) get zeros and write nothing.
    """

    def __init__(self, cache: KVCache, slot_mapping: Tensor, ctx_slots: Tensor, spans: list[SeqSpan],
                 groups: list[DecodeGroup], prefill: PrefillTables | None = None, min_rows: int = 0) -> None:
        self.cache = cache
        self.min_rows = min_rows  # batch invariance: prefill tiles padded to this many query rows
        self.prefill = prefill
        self.slot_mapping = slot_mapping  # [N_real] long
        self.ctx_slots = ctx_slots  # [sum ctx_len] long, the chunked sequences' context slots back to back
        self.spans = spans
        self.groups = groups
        self.recurrent: Any = None  # hybrid models: the step's RecurrentBatch (models/recurrent_batch.py)

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        n = self.slot_mapping.shape[0]
        k_layer, v_layer = self.cache.k[layer_idx], self.cache.v[layer_idx]  # [Hkv, S, d]
        k_layer.index_copy_(1, self.slot_mapping, k[:n].transpose(0, 1))
        v_layer.index_copy_(1, self.slot_mapping, v[:n].transpose(0, 1))
        out = torch.zeros_like(q)  # [N, Hq, d]
        for grp in self.groups:
            keys = k_layer.index_select(1, grp.slots)  # [Hkv, G*Lpad, d]
            values = v_layer.index_select(1, grp.slots)
            out[grp.rows] = decode_attention(q[grp.rows], keys, values, grp.pad)
        if self.spans and self.prefill is not None:
            p = self.prefill
            K.paged_prefill(q, k_layer, v_layer, p.tables, p.q_starts, p.q_lens, p.ctx_lens, self.cache.block_size,
                            p.max_q, out=out)
        elif self.spans:
            self._attend_spans(q, k_layer, v_layer, out)
        return out

    def _attend_spans(self, q: Tensor, k_layer: Tensor, v_layer: Tensor, out: Tensor) -> None:
        """Causal attention of the multi-token chunks, one batch per run of adjacent chunks of one shape."""
        keys = k_layer.index_select(1, self.ctx_slots).transpose(0, 1)  # [T, Hkv, d]
        values = v_layer.index_select(1, self.ctx_slots).transpose(0, 1)
        for first, count in span_runs(self.spans):
            s = self.spans[first]
            rows = slice(s.q_start, s.q_start + count * s.q_len)
            ctx = slice(s.ctx_start, s.ctx_start + count * s.ctx_len)
            q_run = q[rows].view(count, s.q_len, *q.shape[1:])  # [n, Lq, Hq, d]
            k_run, v_run = (x[ctx].view(count, s.ctx_len, *x.shape[1:]) for x in (keys, values))  # [n, Lk, Hkv, d]
            out[rows] = causal_attention_batch(q_run, k_run, v_run, self.min_rows).reshape(count * s.q_len,
                                                                                           *q.shape[1:])


def span_runs(spans: list[SeqSpan]) -> list[tuple[int, int]]:
    """(first index, count) of each maximal run of spans of one (q_len, ctx_len) whose queries and contexts follow
    each other directly, so that the run is one view of the flat batch and of the gathered keys."""
    runs: list[tuple[int, int]] = []
    for i, s in enumerate(spans):
        prev = spans[i - 1] if i else None
        if runs and prev is not None and (s.q_len, s.ctx_len) == (prev.q_len, prev.ctx_len) and \
                s.q_start == prev.q_start + prev.q_len and s.ctx_start == prev.ctx_start + prev.ctx_len:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs
