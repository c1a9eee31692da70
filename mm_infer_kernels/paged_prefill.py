"""Paged prefill/extend attention: a batch's chunks of new queries, each over its cached prefix plus its own causal
keys, read through block tables (Triton launcher + torch reference). Covers prefix-cache hits, chunked prefill and
a group's n samples sharing prompt blocks."""

from __future__ import annotations

import torch

from mm_infer_kernels import _triton

BLOCK_M = 16  # queries per program


def check_prefill_args(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                       q_starts: torch.Tensor, q_lens: torch.Tensor, ctx_lens: torch.Tensor, block_size: int) -> None:
    assert q.ndim == 3 and k_cache.ndim == 3 and k_cache.shape == v_cache.shape, "q [N,Hq,D], caches [Hkv,S,D]"
    assert q.shape[2] == k_cache.shape[2] and q.shape[1] % k_cache.shape[0] == 0, "head dims / GQA groups"
    b = tables.shape[0]
    assert tables.ndim == 2 and q_starts.shape == q_lens.shape == ctx_lens.shape == (b,), \
        "tables [B, blocks], q_starts / q_lens / ctx_lens [B]"
    assert k_cache.shape[1] % block_size == 0, "cache slots must be whole blocks"
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("tables", tables), ("q_starts", q_starts),
                    ("q_lens", q_lens), ("ctx_lens", ctx_lens)):
        assert t.device == q.device, f"{name} on {t.device}, q on {q.device}"


def paged_prefill_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                            q_starts: torch.Tensor, q_lens: torch.Tensor, ctx_lens: torch.Tensor, block_size: int,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """Sequence b's queries are rows q_starts[b] .. + q_lens[b] of q [N, Hq, D]; caches [Hkv, slots, D], tables
    [B, max_blocks], ctx_lens [B] (its keys in the cache, its chunk's included). Writes those rows of out (zeros
    elsewhere when out is None) and returns it; float32 math, one sequence at a time."""
    check_prefill_args(q, k_cache, v_cache, tables, q_starts, q_lens, ctx_lens, block_size)
    hq, d = q.shape[1:]
    hkv = k_cache.shape[0]
    out = torch.zeros_like(q) if out is None else out
    rows = zip(q_starts.tolist(), q_lens.tolist(), ctx_lens.tolist(), strict=True)  # host ints: the reference syncs
    for b, (start, n, ctx) in enumerate(rows):
        end = start + n
        if n == 0:
            continue
        slots = (tables[b].long()[:, None] * block_size + torch.arange(block_size, device=q.device)).reshape(-1)[:ctx]
        keys = k_cache[:, slots].float().repeat_interleave(hq // hkv, dim=0)  # [Hq, ctx, D]
        values = v_cache[:, slots].float().repeat_interleave(hq // hkv, dim=0)
        qs = q[start:end].float().transpose(0, 1)  # [Hq, n, D]
        pos = torch.arange(ctx - (end - start), ctx, device=q.device)  # [n]
        hidden = torch.arange(ctx, device=q.device)[None, :] > pos[:, None]  # [n, ctx] keys after the query
        scores = (qs @ keys.transpose(1, 2)) * d**-0.5  # [Hq, n, ctx]
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        out[start:end] = (probs @ values).transpose(0, 1).to(q.dtype)
    return out


def paged_prefill_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                         q_starts: torch.Tensor, q_lens: torch.Tensor, ctx_lens: torch.Tensor, block_size: int,
                         max_q: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton paged prefill: the reference's numbers to fp32 rounding. max_q: the longest chunk (a host int the
    scheduler knows, so the launch needs no device read)."""
    check_prefill_args(q, k_cache, v_cache, tables, q_starts, q_lens, ctx_lens, block_size)
    assert k_cache.stride(2) == 1 and q.stride(2) == 1 and tables.stride(1) == 1, "unit inner strides"
    hq, d = q.shape[1:]
    out = torch.zeros_like(q) if out is None else out
    assert out.shape == q.shape and out.stride(2) == 1, "out like q"
    if tables.shape[0] == 0 or max_q == 0:
        return out
    jit = _triton.load("_paged_prefill_triton", q, k_cache, v_cache)
    grid = (tables.shape[0], -(-max_q // BLOCK_M), hq)
    jit.paged_prefill_kernel[grid](
        q, k_cache, v_cache, tables, q_starts, q_lens, ctx_lens, out, d**-0.5, q.stride(0), q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1), tables.stride(0), out.stride(0), out.stride(1),
        GROUP=hq // k_cache.shape[0], BLOCK_M=BLOCK_M, BLOCK=block_size, DIM=d,
        DIM_PAD=_triton.next_power_of_2(d), num_warps=4)
    return out
