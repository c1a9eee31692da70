"""@triton.jit kernel of fused_patchify.py (imported by its launcher through mm_infer_kernels._triton.load)."""

from __future__ import annotations

import triton
import triton.language as tl

from mm_infer_kernels._jit import cast_out, gather_normalized, row_coords


@triton.jit
def patchify_kernel(src_ptr, out_ptr, norm_ptr, rescale_ptr, meta_ptr, block_item_ptr, block_row_ptr,
                    BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr, PATCH: tl.constexpr, TPATCH: tl.constexpr,
                    MERGE: tl.constexpr, CH: tl.constexpr, CHW: tl.constexpr, PIL: tl.constexpr,
                    OUT_BF16: tl.constexpr):
    WIDTH: tl.constexpr = CH * TPATCH * PATCH * PATCH
    item = tl.load(block_item_ptr + tl.program_id(0))
    meta = meta_ptr + item * 8  # src_off, T, H, W, out_row0, n_rows, gh, gw (int64)
    src_off, T, H, W = tl.load(meta), tl.load(meta + 1), tl.load(meta + 2), tl.load(meta + 3)
    out_row0, n_rows, gh, gw = tl.load(meta + 4), tl.load(meta + 5), tl.load(meta + 6), tl.load(meta + 7)
    r = tl.load(block_row_ptr + tl.program_id(0)) + tl.arange(0, BLOCK_R)  # [BR] item-local merge-order row
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)  # [BF] feature (c, tt, py, px)
    gt, ph, pw = row_coords(r, gh, gw, MERGE)
    mask_r = r < n_rows
    out = gather_normalized(src_ptr, norm_ptr, rescale_ptr, src_off, T, H, W, gt, ph, pw, mask_r, f,
                            PATCH, TPATCH, CH, CHW, PIL)  # [BR, BF] float32
    dst = out_ptr + (out_row0 + r)[:, None] * WIDTH + f[None, :]
    mask = mask_r[:, None] & (f < WIDTH)[None, :]
    tl.store(dst, cast_out(out, OUT_BF16, out_ptr.dtype.element_ty), mask=mask)
