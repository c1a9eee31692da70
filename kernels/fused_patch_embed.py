"""Patchify + Conv3d patch embedding as one Triton matmul whose A tiles are gathered from uint8 frames."""

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
    rescale_tensor,
    row_coords,
    single_item,
)
from kernels._items import row_blocks
from kernels._triton import cast_out, interpreting, round_to_bf16_rne, tl, triton
from kernels.fused_patchify import patchify_packed_reference, patchify_packed_triton, patchify_reference

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


def patch_embed_reference(frames: torch.Tensor, weight: torch.Tensor, *, norm: Normalize = CLIP,
                          geometry: PatchGeometry = QWEN2_VL) -> torch.Tensor:
    """Reference for one item: patchify in the weight dtype, then rows @ W.T -> [t*h*w, D]."""
    w = weight_matrix(weight, geometry)  # [D, width]
    rows = patchify_reference(frames, out_dtype=w.dtype, norm=norm, geometry=geometry)  # [R, width]
    return rows @ w.T  # [R, D]


def patch_embed_packed_reference(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, weight: torch.Tensor, *,
                                 norm: Normalize = CLIP, geometry: PatchGeometry = QWEN2_VL,
                                 layout: Layout = "thwc") -> torch.Tensor:
    """Reference for a packed batch: all items' rows (reference patchify), then one rows @ W.T -> [R, D]."""
    w = weight_matrix(weight, geometry)  # [D, width]
    rows = patchify_packed_reference(buffer, offsets, thw, out_dtype=w.dtype, norm=norm, geometry=geometry,
                                     layout=layout)  # [R, width]
    return rows @ w.T  # [R, D]


@triton.jit
def _patch_embed_kernel(src_ptr, w_ptr, out_ptr, norm_ptr, rescale_ptr, meta_ptr, block_item_ptr, block_row_ptr,
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
_patch_embed_tuned = triton.autotune(_CONFIGS, key=["D", "A_BF16", "DOT_FP32"])(_patch_embed_kernel)


def patch_embed_packed_triton(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, weight: torch.Tensor, *,
                              norm: Normalize = CLIP, geometry: PatchGeometry = QWEN2_VL,
                              layout: Layout = "thwc") -> torch.Tensor:
    """Triton patch embedding of a packed batch -> [sum(t*h*w), D] in the weight dtype."""
    w = weight_matrix(weight, geometry)  # [D, width]
    assert w.device == buffer.device, f"weight on {w.device}, frames on {buffer.device}"
    offs, sizes = check_packed(buffer, offsets, thw, geometry, layout)
    dev, d = buffer.device, w.shape[0]
    meta, n_rows = item_meta(offs, sizes, geometry, dev)
    out = torch.empty(sum(n_rows), d, dtype=w.dtype, device=dev)  # [rows, D]
    block_item, block_row = row_blocks(n_rows, BLOCK_M, dev)
    is_bf16 = w.dtype == torch.bfloat16
    _patch_embed_tuned[lambda cfg: (block_item.numel(), triton.cdiv(d, cfg["BLOCK_N"]))](
        buffer, w, out, norm.table(dev), rescale_tensor(dev), meta, block_item, block_row, d, BLOCK_M=BLOCK_M,
        PATCH=geometry.patch_size, TPATCH=geometry.temporal_patch_size, MERGE=geometry.merge_size, CH=CHANNELS,
        CHW=layout == "tchw", PIL=norm.backend == "pil", A_BF16=is_bf16,
        DOT_FP32=w.dtype == torch.float32 or interpreting(), OUT_BF16=is_bf16)
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
    return rows @ w.T  # [R, D]
