"""@triton.jit kernel of patch_merge.py (imported by its launcher through mm_infer_kernels._triton.load)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def patch_merge_kernel(x_ptr, out_ptr, meta_ptr, block_item_ptr, block_row_ptr, D, x_s,
                       BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, MERGE: tl.constexpr,
                       INVERSE: tl.constexpr):
    item = tl.load(block_item_ptr + tl.program_id(0))
    meta = meta_ptr + item * 4  # row0, n_rows, gh, gw (int64)
    row0, n_rows, gh, gw = tl.load(meta), tl.load(meta + 1), tl.load(meta + 2), tl.load(meta + 3)
    r = tl.load(block_row_ptr + tl.program_id(0)) + tl.arange(0, BLOCK_R)  # [BR] item-local merge-order row
    c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BD]
    gt, blk = r // (gh * gw), (r % (gh * gw)) // (MERGE * MERGE)
    ph = (blk // (gw // MERGE)) * MERGE + (r // MERGE) % MERGE
    pw = (blk % (gw // MERGE)) * MERGE + r % MERGE
    raster = gt * gh * gw + ph * gw + pw  # [BR]
    if INVERSE:
        src, dst = row0 + r, row0 + raster
    else:
        src, dst = row0 + raster, row0 + r
    mask = (r < n_rows)[:, None] & (c < D)[None, :]
    v = tl.load(x_ptr + src[:, None] * x_s + c[None, :], mask=mask)
    tl.store(out_ptr + dst[:, None] * D + c[None, :], v, mask=mask)
