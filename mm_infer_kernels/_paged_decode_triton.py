"""@triton.jit kernel of paged_decode.py (imported by its launcher through mm_infer_kernels._triton.load)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_decode_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, o_ptr, scale,
                        q_b, q_h, kv_h, kv_s, t_b, o_b, o_h,
                        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK: tl.constexpr, DIM: tl.constexpr,
                        DIM_PAD: tl.constexpr):
    """One program per (sequence, kv head): online softmax over the sequence's cache blocks, fp32 accumulation.

    q [B, Hq, D]; k/v cache [Hkv, slots, D]; tables [B, max_blocks] int32/64; lens [B]; out [B, Hq, D].
    The loop bound is the sequence's own length, read on the device: one launch shape serves any lengths.
    """
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    g = tl.arange(0, GROUP_PAD)  # query heads of this kv head
    d = tl.arange(0, DIM_PAD)
    t = tl.arange(0, BLOCK)
    gmask, dmask = g < GROUP, d < DIM
    heads = kvh * GROUP + g
    q = tl.load(q_ptr + b * q_b + heads[:, None] * q_h + d[None, :], mask=gmask[:, None] & dmask[None, :],
                other=0.0).to(tl.float32)  # [G, D]
    length = tl.load(lens_ptr + b)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    for blk in range(0, tl.cdiv(length, BLOCK)):
        phys = tl.load(tables_ptr + b * t_b + blk).to(tl.int64)
        slots = phys * BLOCK + t  # [T]
        tmask = blk * BLOCK + t < length
        kv_off = kvh * kv_h + slots[:, None] * kv_s + d[None, :]
        kvmask = tmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + kv_off, mask=kvmask, other=0.0).to(tl.float32)  # [T, D]
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [G, T]
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])  # [G, T]
        v = tl.load(v_ptr + kv_off, mask=kvmask, other=0.0).to(tl.float32)  # [T, D]
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        l = l * alpha + tl.sum(p, axis=1)
        m = m_new
    out = acc / l[:, None]
    tl.store(o_ptr + b * o_b + heads[:, None] * o_h + d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=gmask[:, None] & dmask[None, :])
