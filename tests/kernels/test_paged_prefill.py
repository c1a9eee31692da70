"""Paged prefill/extend attention: Triton (CUDA, or the interpreter) against the torch reference and a dense oracle."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import paged_cache

from mm_infer_kernels import paged_prefill as pp


def case(device, ctx: list[int], new: list[int], hq: int = 6, hkv: int = 2, d: int = 16, block: int = 16,
         seed: int = 0):
    """Each sequence's ctx keys in shuffled cache blocks; its last `new` positions are the chunk's queries."""
    g = torch.Generator().manual_seed(seed)
    k, v, tables = paged_cache(ctx, hkv, d, block, g)
    q = torch.randn(sum(new), hq, d, generator=g)
    starts = torch.tensor([sum(new[:i]) for i in range(len(new))])
    put = lambda t: t.to(device)  # noqa: E731
    return (put(q), put(k), put(v), put(torch.tensor(tables, dtype=torch.int32)), put(starts),
            put(torch.tensor(new)), put(torch.tensor(ctx)), tables)


def dense(q, k, v, raw_tables, starts, lens, ctx, block):
    """Oracle: causal attention over each whole sequence (every key, SDPA with is_causal offsets), last rows kept."""
    outs = []
    hq, hkv = q.shape[1], k.shape[0]
    for b, c in enumerate(ctx.tolist()):
        start, end = starts[b].item(), starts[b].item() + lens[b].item()
        if end == start:
            continue
        slots = (torch.tensor(raw_tables[b])[:, None] * block + torch.arange(block)).reshape(-1)[:c].to(q.device)
        keys = k[:, slots].repeat_interleave(hq // hkv, 0)  # [Hq, c, D]
        values = v[:, slots].repeat_interleave(hq // hkv, 0)
        pos = torch.arange(c - (end - start), c)
        mask = torch.arange(c)[None, :] <= pos[:, None]  # [n, c]
        o = torch.nn.functional.scaled_dot_product_attention(q[start:end].transpose(0, 1), keys, values,
                                                             attn_mask=mask.to(q.device))
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


CASES = [  # (ctx, new): whole prompts, prefix-cache hits, chunk boundaries mid-block, an empty chunk, one token
    ([5, 16, 17, 40], [5, 16, 17, 40]),
    ([40, 33, 64], [8, 1, 30]),
    ([70, 3], [0, 3]),
    ([1], [1]),
]


@pytest.mark.parametrize("ctx, new", CASES)
def test_reference_equals_dense_causal_attention(ctx, new):
    # catches: the query position offset (ctx - n), keys past a query visible, the slot formula, GQA mapping
    q, k, v, tables, starts, lens, ctxs, raw = case("cpu", ctx, new)
    got = pp.paged_prefill_reference(q, k, v, tables, starts, lens, ctxs, 16)
    torch.testing.assert_close(got, dense(q, k, v, raw, starts, lens, ctxs, 16), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("ctx, new", CASES)
@pytest.mark.parametrize("hq, hkv, d, block", [(6, 2, 16, 16), (7, 1, 24, 32), (4, 4, 8, 8)])
def test_triton_equals_the_reference(device, ctx, new, hq, hkv, d, block):
    # catches: the online-softmax rescale, the per-tile key bound, padded head dims, tiles past a short chunk
    q, k, v, tables, starts, lens, ctxs, _ = case(device, ctx, new, hq, hkv, d, block)
    got = pp.paged_prefill_triton(q, k, v, tables, starts, lens, ctxs, block, max_q=max(new))
    want = pp.paged_prefill_reference(q, k, v, tables, starts, lens, ctxs, block)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_blocks_past_a_sequence_are_never_read(device):
    # poison every slot no sequence owns, and each sequence's slots past its length: outputs must not change
    q, k, v, tables, starts, lens, ctxs, raw = case(device, [20, 9], [12, 9])
    clean = pp.paged_prefill_triton(q, k, v, tables, starts, lens, ctxs, 16, max_q=12)
    owned = torch.zeros(k.shape[1], dtype=torch.bool)
    for b, c in enumerate([20, 9]):
        owned[(torch.tensor(raw[b])[:, None] * 16 + torch.arange(16)).reshape(-1)[:c]] = True
    k2, v2 = k.clone(), v.clone()
    k2[:, ~owned.to(k.device)] = float("nan")
    v2[:, ~owned.to(k.device)] = float("nan")
    assert torch.equal(pp.paged_prefill_triton(q, k2, v2, tables, starts, lens, ctxs, 16, max_q=12), clean)


def test_rows_of_other_work_are_left_alone(device):
    # the engine's batch interleaves decode rows: out rows outside the chunks keep what the caller put there
    q, k, v, tables, starts, lens, ctxs, _ = case(device, [20, 9], [4, 3])
    q = torch.cat([q[:4], torch.randn(2, *q.shape[1:], device=q.device), q[4:]])  # 2 foreign rows at 4..5
    starts = torch.tensor([0, 6], device=q.device)
    out = torch.full_like(q, 7.0)
    pp.paged_prefill_triton(q, k, v, tables, starts, lens, ctxs, 16, max_q=4, out=out)
    assert torch.equal(out[4:6], torch.full_like(out[4:6], 7.0))
    want = pp.paged_prefill_reference(q, k, v, tables, starts, lens, ctxs, 16)
    torch.testing.assert_close(out[[0, 1, 2, 3, 6, 7, 8]], want[[0, 1, 2, 3, 6, 7, 8]], atol=2e-5, rtol=1e-4)


def test_bad_arguments_are_refused(device):
    q, k, v, tables, starts, lens, ctxs, _ = case(device, [5], [5])
    with pytest.raises(AssertionError, match="q_starts"):
        pp.paged_prefill_triton(q, k, v, tables, starts[:0], lens, ctxs, 16, max_q=5)
    with pytest.raises(AssertionError, match="GQA"):
        pp.paged_prefill_triton(q[:, :5], k, v, tables, starts, lens, ctxs, 16, max_q=5)
