"""uint8 RGB frames -> normalised Qwen2-VL pixel_values rows in one pass (kernel, launcher, reference)."""

from __future__ import annotations

import torch

from kernels._frames import (
    CHANNELS,
    CLIP,
    QWEN2_VL,
    Layout,
    Normalize,
    Offsets,
    PatchGeometry,
    Sizes,
    check_packed,
    gather_normalized,
    item_meta,
    item_view,
    rescale_tensor,
    row_coords,
    single_item,
)
from kernels._items import row_blocks
from kernels._triton import cast_out, interpreting, tl, triton

OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def patchify_reference(frames: torch.Tensor, *, out_dtype: torch.dtype = torch.float32, norm: Normalize = CLIP,
                       geometry: PatchGeometry = QWEN2_VL) -> torch.Tensor:
    """Plain-torch Qwen2-VL patchify of one item: [T, H, W, 3] uint8 -> [t*h*w, 3*tp*p*p] out_dtype."""
    x = norm.apply(frames).permute(0, 3, 1, 2)  # [T, C, H, W] float32
    p, tp, m = geometry.patch_size, geometry.temporal_patch_size, geometry.merge_size
    pad = -x.shape[0] % tp
    if pad:
        x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)], dim=0)  # [T_pad, C, H, W]
    gt, gh, gw = x.shape[0] // tp, x.shape[2] // p, x.shape[3] // p
    x = x.reshape(gt, tp, CHANNELS, gh // m, m, p, gw // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # [gt, gh/m, gw/m, m, m, C, tp, p, p]
    return x.reshape(gt * gh * gw, CHANNELS * tp * p * p).to(out_dtype)  # [rows, width]


def patchify_packed_reference(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, *, layout: Layout = "thwc",
                              geometry: PatchGeometry = QWEN2_VL, **kwargs) -> torch.Tensor:
    """Reference for a packed batch: items' rows concatenated in order, [sum(t*h*w), width]."""
    offs, sizes = check_packed(buffer, offsets, thw, geometry, layout)
    return torch.cat([patchify_reference(item_view(buffer, o, s, layout), geometry=geometry, **kwargs)
                      for o, s in zip(offs, sizes, strict=True)])


@triton.jit
def _patchify_kernel(src_ptr, out_ptr, norm_ptr, rescale_ptr, meta_ptr, block_item_ptr, block_row_ptr,
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


def patchify_packed_triton(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, *,
                           out_dtype: torch.dtype = torch.float32, norm: Normalize = CLIP,
                           geometry: PatchGeometry = QWEN2_VL, layout: Layout = "thwc") -> torch.Tensor:
    """Triton patchify of a packed batch: flat uint8 buffer + element offsets + (T, H, W) -> [rows, width]."""
    assert out_dtype in OUT_DTYPES, f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}"
    offs, sizes = check_packed(buffer, offsets, thw, geometry, layout)
    dev = buffer.device
    meta, n_rows = item_meta(offs, sizes, geometry, dev)
    out = torch.empty(sum(n_rows), geometry.width, dtype=out_dtype, device=dev)  # [rows, width]
    block_r, block_f = (32, 512) if interpreting() else (16, 128)
    block_item, block_row = row_blocks(n_rows, block_r, dev)
    grid = (block_item.numel(), triton.cdiv(geometry.width, block_f))
    _patchify_kernel[grid](buffer, out, norm.table(dev), rescale_tensor(dev), meta, block_item, block_row,
                           BLOCK_R=block_r, BLOCK_F=block_f, PATCH=geometry.patch_size,
                           TPATCH=geometry.temporal_patch_size, MERGE=geometry.merge_size, CH=CHANNELS,
                           CHW=layout == "tchw", PIL=norm.backend == "pil", OUT_BF16=out_dtype == torch.bfloat16,
                           num_warps=4)
    return out


def patchify_triton(frames: torch.Tensor, **kwargs) -> torch.Tensor:
    """Triton patchify of one item [T, H, W, 3] uint8 (contiguous, or [T, 3, H, W] permuted) -> rows."""
    buffer, offsets, thw, layout = single_item(frames)
    return patchify_packed_triton(buffer, offsets, thw, layout=layout, **kwargs)
