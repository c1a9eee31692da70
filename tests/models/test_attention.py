"""DenseAttentionContext / causal_attention against an explicit softmax reference and per-sequence SDPA calls."""

from __future__ import annotations

import math

import pytest
import torch

from mm_infer.models import AttentionContext, DenseAttentionContext
from mm_infer.models.attention import causal_attention, causal_attention_batch, equal_runs


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


def sdpa_one_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """What causal_attention used to be: one 3-D SDPA call (torch's math kernel on the CPU) for one sequence."""
    lq, hq, d = q.shape
    lk, hkv = k.shape[:2]
    k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
    mask = None if lk == lq else torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, is_causal=mask is None,
        scale=d**-0.5)
    return out.transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "lq", "lk", "hq", "hkv", "d"), [
    (32, 80, 80, 4, 2, 32),  # a wave of equal prompts
    (5, 17, 17, 14, 2, 64),  # GQA ratio 7
    (4, 33, 97, 4, 4, 32),  # chunks after a prefix hit (masked form), no GQA
    (3, 1, 50, 4, 2, 32),  # one query over a long context
    (2, 130, 130, 8, 4, 16),
])
def test_batch_equals_one_sdpa_call_per_sequence_bit_for_bit(n, lq, lk, hq, hkv, d, dtype):
    # catches: a scale applied once instead of split over q and k, a mask built differently for hits and misses,
    # bf16 not computed in float32, or rows of one sequence depending on the others in the batch
    gen = torch.Generator().manual_seed(n + lq)
    q = torch.randn(n, lq, hq, d, generator=gen).to(dtype)
    k = torch.randn(n, lk, hkv, d, generator=gen).to(dtype)
    v = torch.randn(n, lk, hkv, d, generator=gen).to(dtype)
    got = causal_attention_batch(q, k, v)
    assert got.dtype == dtype and got.shape == q.shape
    for i in range(n):
        assert torch.equal(got[i], sdpa_one_sequence(q[i], k[i], v[i])), f"sequence {i}"
        assert torch.equal(got[i], causal_attention(q[i], k[i], v[i]))


def test_dense_context_batches_runs_of_equal_lengths_without_changing_numbers():
    # catches: a run boundary off by one (rows of one sequence attending into its neighbour's)
    gen = torch.Generator().manual_seed(2)
    lens = [6, 6, 6, 1, 9, 9, 6]
    q, k, v = (torch.randn(sum(lens), h, 8, generator=gen) for h in (4, 2, 2))
    got = DenseAttentionContext(lens).attend(0, q, k, v)
    want = torch.cat([sdpa_one_sequence(*(x.split(lens)[i] for x in (q, k, v))) for i in range(len(lens))])
    assert torch.equal(got, want)


def test_equal_runs():
    assert equal_runs([6, 6, 6, 1, 9, 9, 6]) == [(0, 3), (3, 1), (4, 2), (6, 1)]
    assert equal_runs([]) == []
