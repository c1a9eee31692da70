"""@triton.jit kernel of gated_delta_segments.py (imported by its launcher through mm_infer_kernels._triton.load)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gated_delta_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, pool_ptr, o_ptr, state_out_ptr, snap_out_ptr,
                       starts_ptr, lens_ptr, read_ptr, snap_ptr, H, DK, DV,
                       BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, SNAPS: tl.constexpr):
    """One program per (segment, value head, dv block): the gated delta rule over the segment's tokens in order,
    float32. q/k [N, H, DK] (normed, q scaled), v/o [N, H, DV], g/beta [N, H]; the state [DK, DV] starts from pool
    slot read_ptr[s] (-1: zeros), ends in state_out [S, H, DK, DV] and, after snap_ptr[s] > 0 tokens, in snap_out.
        S = e^g S;  S += k (beta (v - S^T k))^T;  o = S^T q"""
    s = tl.program_id(0)
    h = tl.program_id(1)
    j = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    i = tl.arange(0, BLOCK_K)
    imask, jmask = i < DK, j < DV
    smask = imask[:, None] & jmask[None, :]
    row0 = tl.load(starts_ptr + s)
    length = tl.load(lens_ptr + s)
    slot = tl.load(read_ptr + s)
    st_off = h * DK * DV + i[:, None] * DV + j[None, :]
    has_state = tl.zeros([BLOCK_K, BLOCK_V], tl.int32) + (slot >= 0).to(tl.int32) > 0  # the interpreter's masks
    state = tl.load(pool_ptr + tl.maximum(slot, 0).to(tl.int64) * H * DK * DV + st_off, mask=smask & has_state,
                    other=0.0)
    for t in range(0, length):
        row = row0 + t
        q = tl.load(q_ptr + row * H * DK + h * DK + i, mask=imask, other=0.0)  # [DK]
        k = tl.load(k_ptr + row * H * DK + h * DK + i, mask=imask, other=0.0)
        v = tl.load(v_ptr + row * H * DV + h * DV + j, mask=jmask, other=0.0)  # [BV]
        g = tl.load(g_ptr + row * H + h)
        beta = tl.load(beta_ptr + row * H + h)
        state = state * tl.exp(g)
        remembered = tl.sum(state * k[:, None], axis=0)  # [BV]
        delta = (v - remembered) * beta
        state = state + k[:, None] * delta[None, :]
        o = tl.sum(state * q[:, None], axis=0)
        tl.store(o_ptr + row * H * DV + h * DV + j, o, mask=jmask)
        for m in tl.static_range(SNAPS):
            if t + 1 == tl.load(snap_ptr + s * SNAPS + m):
                tl.store(snap_out_ptr + (s * SNAPS + m) * H * DK * DV + st_off, state, mask=smask)
    tl.store(state_out_ptr + s * H * DK * DV + st_off, state, mask=smask)
