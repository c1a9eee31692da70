"""DenseAttentionContext / causal_attention against an explicit softmax reference."""

from __future__ import annotations

import math

import pytest
import torch

from mm_infer.models import AttentionContext, DenseAttentionContext
from mm_infer.models.attention import causal_attention


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Per head, per query: softmax over keys up to its own position, kv head = q head // group."""
    lq, hq, d = q.shape
    lk, hkv = k.shape[:2]
    out = torch.zeros_like(q)
    for h in range(hq):
        kh, vh = k[:, h // (hq // hkv)], v[:, h // (hq // hkv)]
        for i in range(lq):
            last = lk - lq + i
            scores = kh[: last + 1] @ q[i, h] / math.sqrt(d)
            out[i, h] = torch.softmax(scores, dim=0) @ vh[: last + 1]
    return out


def test_dense_context_is_causal_gqa_per_sequence():
    gen = torch.Generator().manual_seed(0)
    lens = [5, 1, 9]
    q = torch.randn(sum(lens), 4, 8, generator=gen)
    k = torch.randn(sum(lens), 2, 8, generator=gen)
    v = torch.randn(sum(lens), 2, 8, generator=gen)
    ctx = DenseAttentionContext(lens)
    assert isinstance(ctx, AttentionContext)
    got = ctx.attend(0, q, k, v)
    want = torch.cat([reference(*(x.split(lens)[i] for x in (q, k, v))) for i in range(len(lens))])
    assert (got - want).abs().max().item() <= 1e-6


def test_queries_at_the_end_of_longer_keys():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(7, 4, 8, generator=gen)
    k, v = torch.randn(7, 2, 8, generator=gen), torch.randn(7, 2, 8, generator=gen)
    tail = causal_attention(q[-3:], k, v)
    assert (tail - causal_attention(q, k, v)[-3:]).abs().max().item() <= 1e-6
    assert (tail - reference(q[-3:], k, v)).abs().max().item() <= 1e-6


def test_token_count_must_match():
    ctx = DenseAttentionContext([2, 3])
    x = torch.zeros(4, 2, 8)
    with pytest.raises(ValueError, match="4 tokens"):
        ctx.attend(0, x, x, x)
    with pytest.raises(ValueError, match="positive"):
        DenseAttentionContext([2, 0])
