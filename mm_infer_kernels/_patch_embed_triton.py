"""@triton.jit kernel of fused_patch_embed.py (imported by its launcher through mm_infer_kernels._triton.load)."""

from __future__ import annotations

import triton
import triton.language as tl

from mm_infer_kernels._jit import cast_out, gather_normalized, round_to_bf16_rne, row_coords
from mm_infer_kernels._triton import interpreting


@triton.jit
def patch_embed_kernel(src_ptr, w_ptr, out_ptr, norm_ptr, rescale_ptr, meta_ptr, block_item_ptr, block_row_ptr,
                       D, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PATCH: tl.constexpr, TPATCH: tl.constexpr, MERGE: tl.constexpr, CH: tl.constexpr,
                       CHW: tl.constexpr, PIL: tl.constexpr, A_BF16: tl.constexpr, DOT_FP32: tl.constexpr,
                       OUT_BF16: tl.constexpr):
    WIDTH: tl.constexpr = CH * TPATCH * PATCH * PATCH
    item = tl.load(block_item_ptr + tl.program_id(0))
    meta = meta_ptr + item * 8  # src_off, T, H, W, out_row0, n_rows, gh, gw (int64)
    src_off, T, H, W = tl.load(meta), tl.load(meta + 1), tl.load(meta + 2), tl.load(meta + 3)
    out_row0, n_rows, gh, gw = tl.load(meta + 4), tl.load(meta + 5), tl.load(meta + 6), tl.load(meta + 7)
    r = tl.load(block_row_ptr + tl.program_id(0)) + tl.arange(0, BLOCK_M)  # [BM] item-local merge-order row
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] output channel
    mask_r, mask_n = r < n_rows, n < D
    gt, ph, pw = row_coords(r, gh, gw, MERGE)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, WIDTH, BLOCK_K):
        f = k0 + tl.arange(0, BLOCK_K)  # [BK] feature (c, tt, py, px)
        a = gather_normalized(src_ptr, norm_ptr, rescale_ptr, src_off, T, H, W, gt, ph, pw, mask_r, f,
                              PATCH, TPATCH, CH, CHW, PIL)  # [BM, BK] float32, exactly as patchify
        mask_b = (f < WIDTH)[:, None] & mask_n[None, :]
        b = tl.load(w_ptr + n[None, :] * WIDTH + f[:, None], mask=mask_b, other=0.0)  # [BK, BN] = W.T tile
        if DOT_FP32:  # fp32 weights, or the interpreter (its bf16 dot is broken); bf16 values stay exact
            if A_BF16:
                a = round_to_bf16_rne(a)
            else:
                a = a.to(b.dtype).to(tl.float32)
            acc += tl.dot(a, b.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(cast_out(a, A_BF16, b.dtype), b)
    dst = out_ptr + (out_row0 + r)[:, None] * D + n[None, :]
    tl.store(dst, cast_out(acc, OUT_BF16, out_ptr.dtype.element_ty), mask=mask_r[:, None] & mask_n[None, :])


# Tuned on CUDA over N/K tiles (M is fixed by the host row-block table); one config in the interpreter.
_CONFIGS = [triton.Config({"BLOCK_N": 64, "BLOCK_K": 128}, num_warps=4)] if interpreting() else [
    triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
    for n, k, w, s in [(128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 4)]]
patch_embed_tuned = triton.autotune(_CONFIGS, key=["D", "A_BF16", "DOT_FP32"])(patch_embed_kernel)
