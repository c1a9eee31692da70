"""Spatial merge: the merger's m x m unit view, and the raster -> merge row gather (launcher + torch reference).

When the gather is free: rows produced by fused_patchify / fused_patch_embed (or HF's processor) are already
in merge order, each m*m block of the grid stored as m² consecutive rows, so the merger's `merge_units`
(x.view(S // m², m² * D)) needs no copy and the gather must NOT be applied. It is needed only for rows in
plain raster order (t, then h, then w), e.g. features from a patchifier that keeps the image layout;
`inverse=True` goes back from merge order to raster order.
"""

from __future__ import annotations

import torch

from mm_infer_kernels import _triton
from mm_infer_kernels._items import exclusive_cumsum, row_blocks, sizes_list


def merge_units(x: torch.Tensor, merge_size: int = 2) -> torch.Tensor:
    """Merge-order rows [S, D] -> [S/m², m²*D]: each m x m block is m² consecutive rows, so a reshape."""
    assert x.ndim == 2 and x.shape[0] % (merge_size * merge_size) == 0, f"{list(x.shape)} vs merge {merge_size}"
    return x.reshape(-1, merge_size * merge_size * x.shape[-1])  # [S/m², m²*D]


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


def patch_merge_triton(x: torch.Tensor, grid_thw: torch.Tensor | list, *, merge_size: int = 2,
                       inverse: bool = False) -> torch.Tensor:
    """Triton row gather for all items in one launch -> new contiguous [S, D] (any dtype)."""
    grids = check_grid(x, grid_thw, merge_size)
    n_rows = [t * h * w for t, h, w in grids]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [S, D]
    if x.numel() == 0:
        return out
    table = [[r0, n, h, w] for r0, n, (_, h, w) in zip(exclusive_cumsum(n_rows), n_rows, grids, strict=True)]
    jit = _triton.load("_merge_triton", x)
    meta = torch.tensor(table, dtype=torch.int64).to(x.device)  # [n, 4]
    block_r, block_d = (64, 256) if _triton.interpreting() else (16, 256)
    block_item, block_row = row_blocks(n_rows, block_r, x.device)
    grid = (block_item.numel(), _triton.cdiv(x.shape[1], block_d))
    jit.patch_merge_kernel[grid](x, out, meta, block_item, block_row, x.shape[1], x.stride(0),
                                 BLOCK_R=block_r, BLOCK_D=block_d, MERGE=merge_size, INVERSE=inverse, num_warps=4)
    return out
