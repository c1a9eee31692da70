"""@triton.jit helpers shared by the kernels; imported only through _triton.load, never at package import."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to_bf16_rne(x):
    """fp32 -> fp32 holding the round-to-nearest-even bf16 value (the interpreter's cast truncates)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    rounded = bits.to(tl.float32, bitcast=True)
    return tl.where(x != x, x, rounded)


@triton.jit
def cast_out(x, OUT_BF16: tl.constexpr, out_dtype: tl.constexpr):
    """fp32 -> the output element type with round-to-nearest-even, bit-equal to torch's .to()."""
    if OUT_BF16:
        x = round_to_bf16_rne(x)
    return x.to(out_dtype)


@triton.jit
def row_coords(r, gh, gw, MERGE: tl.constexpr):
    """Merge-order row index -> (temporal group, patch row, patch col) in the item's patch grid."""
    blk = (r % (gh * gw)) // (MERGE * MERGE)
    ph = (blk // (gw // MERGE)) * MERGE + (r // MERGE) % MERGE
    pw = (blk % (gw // MERGE)) * MERGE + r % MERGE
    return r // (gh * gw), ph, pw


@triton.jit
def gather_normalized(src_ptr, norm_ptr, rescale_ptr, src_off, T, H, W, gt, ph, pw, mask_r, f,
                      PATCH: tl.constexpr, TPATCH: tl.constexpr, CH: tl.constexpr, CHW: tl.constexpr,
                      PIL: tl.constexpr):
    """[BR, BF] float32 normalised pixels of rows (gt, ph, pw) [BR] at features f [BF] = (c, tt, py, px)."""
    mask_f = f < CH * TPATCH * PATCH * PATCH
    c, tt = f // (TPATCH * PATCH * PATCH), (f // (PATCH * PATCH)) % TPATCH
    frame = tl.minimum(gt[:, None] * TPATCH + tt[None, :], T - 1)  # [BR, BF] odd T repeats the last frame
    y = ph[:, None] * PATCH + ((f // PATCH) % PATCH)[None, :]
    x = pw[:, None] * PATCH + (f % PATCH)[None, :]
    if CHW:
        addr = ((frame * CH + c[None, :]) * H + y) * W + x
    else:
        addr = ((frame * H + y) * W + x) * CH + c[None, :]
    v = tl.load(src_ptr + src_off + addr, mask=mask_r[:, None] & mask_f[None, :], other=0).to(tl.float32)
    if PIL:
        v = (v.to(tl.float64) * tl.load(rescale_ptr)).to(tl.float32)
    sub = tl.load(norm_ptr + c, mask=mask_f, other=0.0)  # [BF]
    div = tl.load(norm_ptr + CH + c, mask=mask_f, other=1.0)  # [BF]
    return tl.math.div_rn(v - sub[None, :], div[None, :])  # IEEE division, as torch
