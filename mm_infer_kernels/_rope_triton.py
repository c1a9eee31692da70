"""@triton.jit kernel of vision_rope.py (imported by its launcher through mm_infer_kernels._triton.load)."""

from __future__ import annotations

import triton
import triton.language as tl

from mm_infer_kernels._jit import cast_out


@triton.jit
def _rotate(x_ptr, o_ptr, src, dst, mask, cos1, cos2, sin1, sin2, HALF: tl.constexpr, OUT_BF16: tl.constexpr):
    """out = x*cos + rotate_half(x)*sin on one [BP, BD] tile of both halves, in fp32."""
    x1 = tl.load(x_ptr + src, mask=mask).to(tl.float32)
    x2 = tl.load(x_ptr + src + HALF, mask=mask).to(tl.float32)
    tl.store(o_ptr + dst, cast_out(x1 * cos1 - x2 * sin1, OUT_BF16, o_ptr.dtype.element_ty), mask=mask)
    tl.store(o_ptr + dst + HALF, cast_out(x2 * cos2 + x1 * sin2, OUT_BF16, o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def vision_rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, n_pairs, H,
                       q_s, q_h, k_s, k_h, cs_s, sn_s,
                       HALF: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
                       OUT_BF16: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)  # [BP] flattened (s, h) pair
    d = tl.arange(0, BLOCK_D)  # [BD] index into each half
    s, h = (p // H).to(tl.int64), (p % H).to(tl.int64)
    mask = (p < n_pairs)[:, None] & (d < HALF)[None, :]  # [BP, BD]
    cs = s[:, None] * cs_s + d[None, :]
    sn = s[:, None] * sn_s + d[None, :]
    cos1, cos2 = tl.load(cos_ptr + cs, mask=mask), tl.load(cos_ptr + cs + HALF, mask=mask)
    sin1, sin2 = tl.load(sin_ptr + sn, mask=mask), tl.load(sin_ptr + sn + HALF, mask=mask)
    out = (s * H + h)[:, None] * (2 * HALF) + d[None, :]  # outputs are contiguous [S, H, Dh]
    _rotate(q_ptr, qo_ptr, s[:, None] * q_s + h[:, None] * q_h + d[None, :], out, mask, cos1, cos2, sin1, sin2,
            HALF, OUT_BF16)
    _rotate(k_ptr, ko_ptr, s[:, None] * k_s + h[:, None] * k_h + d[None, :], out, mask, cos1, cos2, sin1, sin2,
            HALF, OUT_BF16)
