"""@triton.jit kernel of paged_prefill.py (imported by its launcher through mm_infer_kernels._triton.load)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_prefill_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, starts_ptr, lens_ptr, ctx_ptr, o_ptr, scale,
                         q_t, q_h, kv_h, kv_s, t_b, o_t, o_h,
                         GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr, DIM: tl.constexpr,
                         DIM_PAD: tl.constexpr):
    """One program per (sequence, query tile, query head): causal online softmax over the sequence's blocks.

    Sequence b's n = lens[b] queries are rows starts[b] .. starts[b] + n - 1 of q [N, Hq, D] (and of out), at
    positions ctx[b] - n .. ctx[b] - 1; its cache (k/v [Hkv, slots, D], tables [B, max_blocks]) already holds all
    ctx[b] keys: the cached prefix (a prefix-cache hit, earlier chunks) and the chunk's own.
    """
    b = tl.program_id(0)
    tile = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // GROUP
    start = tl.load(starts_ptr + b)
    n = tl.load(lens_ptr + b)
    if tile * BLOCK_M < n:
        ctx = tl.load(ctx_ptr + b)
        m_idx = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the chunk
        d = tl.arange(0, DIM_PAD)
        t = tl.arange(0, BLOCK)
        qmask, dmask = m_idx < n, d < DIM
        pos = ctx - n + m_idx  # [M] absolute positions
        q = tl.load(q_ptr + (start + m_idx)[:, None] * q_t + h * q_h + d[None, :],
                    mask=qmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)  # [M, D]
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, DIM_PAD], tl.float32)
        last = tl.minimum(ctx - n + (tile + 1) * BLOCK_M, ctx)  # keys this tile can see: positions < last
        for blk in range(0, tl.cdiv(last, BLOCK)):
            phys = tl.load(tables_ptr + b * t_b + blk).to(tl.int64)
            key_pos = blk * BLOCK + t  # [T]
            kv_off = kvh * kv_h + (phys * BLOCK + t)[:, None] * kv_s + d[None, :]
            kvmask = (key_pos < ctx)[:, None] & dmask[None, :]
            k = tl.load(k_ptr + kv_off, mask=kvmask, other=0.0).to(tl.float32)  # [T, D]
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [M, T]
            visible = (key_pos[None, :] <= pos[:, None]) & (key_pos[None, :] < ctx)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])  # [M, T]
            v = tl.load(v_ptr + kv_off, mask=kvmask, other=0.0).to(tl.float32)  # [T, D]
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            l = l * alpha + tl.sum(p, axis=1)
            m = m_new
        out = acc / tl.where(qmask, l, 1.0)[:, None]
        tl.store(o_ptr + (start + m_idx)[:, None] * o_t + h * o_h + d[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=qmask[:, None] & dmask[None, :])
