"""uint8 RGB frames -> normalised Qwen2-VL pixel_values rows in one pass (launcher + torch reference)."""

from __future__ import annotations

import torch

from mm_infer_kernels import _triton
from mm_infer_kernels._frames import (
    CHANNELS,
    CLIP,
    QWEN2_VL,
    Layout,
    Normalize,
    Offsets,
    PatchGeometry,
    Sizes,
    check_packed,
    item_meta,
    item_view,
    rescale_tensor,
    single_item,
)
from mm_infer_kernels._items import row_blocks

OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def patch_rows(x: torch.Tensor, geometry: PatchGeometry = QWEN2_VL) -> torch.Tensor:
    """Frames [T, C, H, W] (any dtype) -> rows [t*h*w, C*tp*p*p] in Qwen2-VL (merge-block) order.

    T is padded up to a multiple of the temporal patch by repeating the last frame. Rows run over t, then
    merge blocks in raster order, then the m x m patches inside a block; features over C, tp, p, p.
    """
    t, c, h, w = x.shape
    p, tp, m = geometry.patch_size, geometry.temporal_patch_size, geometry.merge_size
    if t == 1:
        x = x.expand(tp, c, h, w)  # one picture fills the temporal patch: a view, no copy
    elif pad := -t % tp:
        x = torch.cat([x, x[-1:].expand(pad, c, h, w)], dim=0)  # [T_pad, C, H, W]
    gt, gh, gw = x.shape[0] // tp, h // p, w // p
    x = x.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # [gt, gh/m, gw/m, m, m, C, tp, p, p]
    return x.reshape(gt * gh * gw, c * tp * p * p)  # [rows, width]


def patchify_reference(frames: torch.Tensor, *, out_dtype: torch.dtype = torch.float32, norm: Normalize = CLIP,
                       geometry: PatchGeometry = QWEN2_VL) -> torch.Tensor:
    """Plain-torch Qwen2-VL patchify of one item: [T, H, W, 3] uint8 -> [t*h*w, 3*tp*p*p] out_dtype."""
    x = norm.apply(frames).permute(0, 3, 1, 2)  # [T, C, H, W] float32
    return patch_rows(x, geometry).to(out_dtype)  # [rows, width]


def patchify_packed_reference(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, *, layout: Layout = "thwc",
                              geometry: PatchGeometry = QWEN2_VL, **kwargs) -> torch.Tensor:
    """Reference for a packed batch: items' rows concatenated in order, [sum(t*h*w), width]."""
    offs, sizes = check_packed(buffer, offsets, thw, geometry, layout)
    return torch.cat([patchify_reference(item_view(buffer, o, s, layout), geometry=geometry, **kwargs)
                      for o, s in zip(offs, sizes, strict=True)])


def patchify_packed_triton(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, *,
                           out_dtype: torch.dtype = torch.float32, norm: Normalize = CLIP,
                           geometry: PatchGeometry = QWEN2_VL, layout: Layout = "thwc") -> torch.Tensor:
    """Triton patchify of a packed batch: flat uint8 buffer + element offsets + (T, H, W) -> [rows, width]."""
    assert out_dtype in OUT_DTYPES, f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}"
    offs, sizes = check_packed(buffer, offsets, thw, geometry, layout)
    jit = _triton.load("_patchify_triton", buffer)
    dev = buffer.device
    meta, n_rows = item_meta(offs, sizes, geometry, dev)
    out = torch.empty(sum(n_rows), geometry.width, dtype=out_dtype, device=dev)  # [rows, width]
    block_r, block_f = (32, 512) if _triton.interpreting() else (16, 128)
    block_item, block_row = row_blocks(n_rows, block_r, dev)
    grid = (block_item.numel(), _triton.cdiv(geometry.width, block_f))
    jit.patchify_kernel[grid](buffer, out, norm.table(dev), rescale_tensor(dev, norm.rescale), meta, block_item,
                              block_row, BLOCK_R=block_r, BLOCK_F=block_f, PATCH=geometry.patch_size,
                              TPATCH=geometry.temporal_patch_size, MERGE=geometry.merge_size, CH=CHANNELS,
                              CHW=layout == "tchw", PIL=norm.backend == "pil",
                              OUT_BF16=out_dtype == torch.bfloat16, num_warps=4)
    return out


def patchify_triton(frames: torch.Tensor, **kwargs) -> torch.Tensor:
    """Triton patchify of one item [T, H, W, 3] uint8 (contiguous, or [T, 3, H, W] permuted) -> rows."""
    buffer, offsets, thw, layout = single_item(frames)
    return patchify_packed_triton(buffer, offsets, thw, layout=layout, **kwargs)
