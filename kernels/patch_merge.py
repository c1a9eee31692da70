"""Spatial-merge row gather: raster-order (t, h, w) rows -> Qwen2-VL merge order (kernel, launcher, reference).

When it is free: rows produced by fused_patchify / fused_patch_embed (or HF's processor) are already in
merge order, each m*m block of the grid stored as m² consecutive rows, so the merger's
`x.view(S // m², m² * D)` needs no copy and this op must NOT be applied. It is needed only for rows in
plain raster order (t, then h, then w), e.g. features from a patchifier that keeps the image layout;
`inverse=True` goes back from merge order to raster order.
"""

from __future__ import annotations

import torch

from kernels._items import exclusive_cumsum, row_blocks, sizes_list
from kernels._triton import interpreting, tl, triton


def check_grid(x: torch.Tensor, grid_thw: torch.Tensor | list, merge_size: int) -> list[list[int]]:
    """Assert x [S, D] with unit last stride and S = sum(t*h*w), h and w multiples of merge_size."""
    assert isinstance(x, torch.Tensor) and x.ndim == 2, f"x must be [S, D], got {getattr(x, 'shape', x)}"
    assert x.stride(1) == 1, "x must have a unit stride on D"
    grids = sizes_list(grid_thw, 3, "grid_thw")
    for _, h, w in grids:
        assert h % merge_size == 0 and w % merge_size == 0, f"grid {h}x{w} vs merge {merge_size}"
    assert sum(t * h * w for t, h, w in grids) == x.shape[0], f"grids need {x.shape[0]} rows"
    return grids


def patch_merge_reference(x: torch.Tensor, grid_thw: torch.Tensor | list, *, merge_size: int = 2,
                          inverse: bool = False) -> torch.Tensor:
    """Reorder each item's rows: raster (t, h, w) -> merge (t, h/m, w/m, m, m), or back when inverse."""
    grids = check_grid(x, grid_thw, merge_size)
    m, d, out = merge_size, x.shape[1], []
    for item, (t, h, w) in zip(torch.split(x, [t * h * w for t, h, w in grids]), grids, strict=True):
        if inverse:
            y = item.reshape(t, h // m, w // m, m, m, d).permute(0, 1, 3, 2, 4, 5)  # [t, h/m, m, w/m, m, D]
        else:
            y = item.reshape(t, h // m, m, w // m, m, d).permute(0, 1, 3, 2, 4, 5)  # [t, h/m, w/m, m, m, D]
        out.append(y.reshape(t * h * w, d))
    return torch.cat(out, dim=0)  # [S, D]


@triton.jit
def _patch_merge_kernel(x_ptr, out_ptr, meta_ptr, block_item_ptr, block_row_ptr, D, x_s,
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


def patch_merge_triton(x: torch.Tensor, grid_thw: torch.Tensor | list, *, merge_size: int = 2,
                       inverse: bool = False) -> torch.Tensor:
    """Triton row gather for all items in one launch -> new contiguous [S, D] (any dtype)."""
    grids = check_grid(x, grid_thw, merge_size)
    n_rows = [t * h * w for t, h, w in grids]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [S, D]
    if x.numel() == 0:
        return out
    table = [[r0, n, h, w] for r0, n, (_, h, w) in zip(exclusive_cumsum(n_rows), n_rows, grids, strict=True)]
    meta = torch.tensor(table, dtype=torch.int64).to(x.device)  # [n, 4]
    block_r, block_d = (64, 256) if interpreting() else (16, 256)
    block_item, block_row = row_blocks(n_rows, block_r, x.device)
    grid = (block_item.numel(), triton.cdiv(x.shape[1], block_d))
    _patch_merge_kernel[grid](x, out, meta, block_item, block_row, x.shape[1], x.stride(0),
                              BLOCK_R=block_r, BLOCK_D=block_d, MERGE=merge_size, INVERSE=inverse, num_warps=4)
    return out
