"""Patchify + Conv3d patch embedding: one Triton matmul gathering A tiles from uint8 frames (+ torch reference)."""

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
    rescale_tensor,
    single_item,
)
from mm_infer_kernels._items import row_blocks
from mm_infer_kernels.fused_patchify import patchify_packed_reference, patchify_packed_triton, patchify_reference

WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BLOCK_M = 64  # rows per tile; fixed because the host row-block table is built with it


def weight_matrix(weight: torch.Tensor, geometry: PatchGeometry = QWEN2_VL) -> torch.Tensor:
    """Conv3d weight [D, 3, tp, p, p] (or already [D, width]) -> [D, width] view; asserts layout."""
    assert isinstance(weight, torch.Tensor) and weight.dtype in WEIGHT_DTYPES, f"weight dtype {weight.dtype}"
    p, tp = geometry.patch_size, geometry.temporal_patch_size
    if weight.ndim == 5:
        assert tuple(weight.shape[1:]) == (CHANNELS, tp, p, p), f"weight must be [D, 3, {tp}, {p}, {p}]"
        weight = weight.reshape(weight.shape[0], -1)
    assert weight.ndim == 2 and weight.shape[1] == geometry.width, f"weight must be [D, {geometry.width}]"
    assert weight.is_contiguous(), "weight must be contiguous"
    return weight  # [D, width]


def patch_embed_rows(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Conv3d with stride == kernel as a matmul: rows [P, width] (cast to the weight dtype) @ W [D, width].T."""
    assert rows.ndim == 2 and weight.ndim == 2, f"rows [P, K], weight [D, K]: {list(rows.shape)}, {list(weight.shape)}"
    assert rows.shape[1] == weight.shape[1], f"rows have {rows.shape[1]} features, weight expects {weight.shape[1]}"
    return rows.to(weight.dtype) @ weight.t()  # [P, D]


def patch_embed_reference(frames: torch.Tensor, weight: torch.Tensor, *, norm: Normalize = CLIP,
                          geometry: PatchGeometry = QWEN2_VL) -> torch.Tensor:
    """Reference for one item: patchify in the weight dtype, then rows @ W.T -> [t*h*w, D]."""
    w = weight_matrix(weight, geometry)  # [D, width]
    rows = patchify_reference(frames, out_dtype=w.dtype, norm=norm, geometry=geometry)  # [R, width]
    return patch_embed_rows(rows, w)  # [R, D]


def patch_embed_packed_reference(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, weight: torch.Tensor, *,
                                 norm: Normalize = CLIP, geometry: PatchGeometry = QWEN2_VL,
                                 layout: Layout = "thwc") -> torch.Tensor:
    """Reference for a packed batch: all items' rows (reference patchify), then one rows @ W.T -> [R, D]."""
    w = weight_matrix(weight, geometry)  # [D, width]
    rows = patchify_packed_reference(buffer, offsets, thw, out_dtype=w.dtype, norm=norm, geometry=geometry,
                                     layout=layout)  # [R, width]
    return patch_embed_rows(rows, w)  # [R, D]


def patch_embed_packed_triton(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, weight: torch.Tensor, *,
                              norm: Normalize = CLIP, geometry: PatchGeometry = QWEN2_VL,
                              layout: Layout = "thwc") -> torch.Tensor:
    """Triton patch embedding of a packed batch -> [sum(t*h*w), D] in the weight dtype."""
    w = weight_matrix(weight, geometry)  # [D, width]
    assert w.device == buffer.device, f"weight on {w.device}, frames on {buffer.device}"
    offs, sizes = check_packed(buffer, offsets, thw, geometry, layout)
    jit = _triton.load("_patch_embed_triton", buffer, w)
    dev, d = buffer.device, w.shape[0]
    meta, n_rows = item_meta(offs, sizes, geometry, dev)
    out = torch.empty(sum(n_rows), d, dtype=w.dtype, device=dev)  # [rows, D]
    block_item, block_row = row_blocks(n_rows, BLOCK_M, dev)
    is_bf16 = w.dtype == torch.bfloat16
    jit.patch_embed_tuned[lambda cfg: (block_item.numel(), _triton.cdiv(d, cfg["BLOCK_N"]))](
        buffer, w, out, norm.table(dev), rescale_tensor(dev, norm.rescale), meta, block_item, block_row, d,
        BLOCK_M=BLOCK_M, PATCH=geometry.patch_size, TPATCH=geometry.temporal_patch_size, MERGE=geometry.merge_size,
        CH=CHANNELS, CHW=layout == "tchw", PIL=norm.backend == "pil", A_BF16=is_bf16,
        DOT_FP32=w.dtype == torch.float32 or _triton.interpreting(), OUT_BF16=is_bf16)
    return out


def patch_embed_triton(frames: torch.Tensor, weight: torch.Tensor, **kwargs) -> torch.Tensor:
    """Triton patch embedding of one item [T, H, W, 3] uint8 (contiguous, or [T, 3, H, W] permuted)."""
    buffer, offsets, thw, layout = single_item(frames)
    return patch_embed_packed_triton(buffer, offsets, thw, weight, layout=layout, **kwargs)


def patch_embed_two_pass_triton(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, weight: torch.Tensor, *,
                                norm: Normalize = CLIP, geometry: PatchGeometry = QWEN2_VL,
                                layout: Layout = "thwc") -> torch.Tensor:
    """Triton patchify to weight-dtype rows, then torch's matmul: bit-equal to the reference, rows materialised."""
    w = weight_matrix(weight, geometry)  # [D, width]
    rows = patchify_packed_triton(buffer, offsets, thw, out_dtype=w.dtype, norm=norm, geometry=geometry,
                                  layout=layout)  # [R, width]
    return patch_embed_rows(rows, w)  # [R, D]
