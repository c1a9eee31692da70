"""Prefill attention batches runs of adjacent equal chunks; each chunk's rows stay those of attending alone."""

from __future__ import annotations

import torch

from mm_infer.engine.runner.paged_attention import KVCache, PagedAttentionContext, SeqSpan, span_runs
from mm_infer.models.attention import causal_attention


def _spans(shapes: list[tuple[int, int]]) -> list[SeqSpan]:
    spans, row, ctx = [], 0, 0
    for q_len, ctx_len in shapes:
        spans.append(SeqSpan(row, q_len, ctx, ctx_len))
        row, ctx = row + q_len, ctx + ctx_len
    return spans


def test_span_runs_join_only_adjacent_chunks_of_one_shape():
    spans = _spans([(5, 5), (5, 5), (3, 8), (5, 5), (5, 5), (5, 5)])
    assert span_runs(spans) == [(0, 2), (2, 1), (3, 3)]
    gap = [SeqSpan(0, 4, 0, 4), SeqSpan(5, 4, 4, 4)]  # a decode row sits between their queries
    assert span_runs(gap) == [(0, 1), (1, 1)]
    assert span_runs([]) == []


def test_paged_prefill_with_runs_equals_each_chunk_alone():
    # catches: a run's view taking the wrong rows or keys (a neighbour's context, a cached prefix dropped)
    gen = torch.Generator().manual_seed(0)
    shapes = [(5, 5), (5, 5), (3, 8), (5, 5)]  # the third chunk follows a 5-token prefix already in the cache
    bs, hq, hkv, d = 4, 4, 2, 8
    cache = KVCache.allocate(1, 16, bs, hkv, d, torch.float32, torch.device("cpu"))
    spans = _spans(shapes)
    ctx_slots, new_slots, slot = [], [], 0
    for q_len, ctx_len in shapes:
        ctx_slots += list(range(slot, slot + ctx_len))
        new_slots += list(range(slot + ctx_len - q_len, slot + ctx_len))
        slot += -(-ctx_len // bs) * bs  # each sequence starts on a fresh block
    n = sum(q for q, _ in shapes)
    prefix = torch.tensor(ctx_slots[10:15])  # the hit's cached keys
    cache.k[0][:, prefix] = torch.randn(hkv, 5, d, generator=gen)
    cache.v[0][:, prefix] = torch.randn(hkv, 5, d, generator=gen)
    q, k, v = (torch.randn(n, h, d, generator=gen) for h in (hq, hkv, hkv))
    ctx = PagedAttentionContext(cache, torch.tensor(new_slots), torch.tensor(ctx_slots), spans, [])
    got = ctx.attend(0, q, k, v)
    keys = cache.k[0][:, torch.tensor(ctx_slots)].transpose(0, 1)
    values = cache.v[0][:, torch.tensor(ctx_slots)].transpose(0, 1)
    for s in spans:
        rows, c = slice(s.q_start, s.q_start + s.q_len), slice(s.ctx_start, s.ctx_start + s.ctx_len)
        assert torch.equal(got[rows], causal_attention(q[rows], keys[c], values[c]))
