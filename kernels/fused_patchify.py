"""uint8 RGB frames -> normalised Qwen2-VL pixel_values rows in one pass (kernel, launcher, reference)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels._items import exclusive_cumsum, row_blocks, sizes_list
from kernels._triton import cast_out, interpreting, tl, triton

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
CHANNELS = 3
Sizes = Sequence[Sequence[int]] | torch.Tensor
Offsets = Sequence[int] | torch.Tensor


@dataclass(frozen=True)
class PatchGeometry:
    """Patch sizes of the vision tower (Qwen2-VL / Qwen2.5-VL defaults)."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2

    @property
    def width(self) -> int:
        """Features per row: C * tp * p * p (1176 for Qwen2-VL)."""
        return CHANNELS * self.temporal_patch_size * self.patch_size * self.patch_size

    def grid(self, thw: Sequence[int]) -> tuple[int, int, int]:
        """Frame sizes (T, H, W) -> patch grid (t, h, w); odd T is padded by repeating the last frame."""
        t, h, w = thw
        tp, p = self.temporal_patch_size, self.patch_size
        return (t + tp - 1) // tp, h // p, w // p


QWEN2_VL = PatchGeometry()


def norm_table(mean: Sequence[float], std: Sequence[float], device: torch.device) -> torch.Tensor:
    """[2, 3] float32: mean*255 and std*255, rounded to float32 exactly as HF's fused rescale+normalise."""
    return torch.stack([torch.tensor(mean) * 255, torch.tensor(std) * 255]).to(device)  # [2, C]


def patchify_reference(frames: torch.Tensor, *, out_dtype: torch.dtype = torch.float32,
                       mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD,
                       geometry: PatchGeometry = QWEN2_VL) -> torch.Tensor:
    """Plain-torch Qwen2-VL patchify of one item: [T, H, W, 3] uint8 -> [t*h*w, 3*tp*p*p] out_dtype."""
    norm = norm_table(mean, std, frames.device)  # [2, C]
    x = (frames.float() - norm[0]) / norm[1]  # [T, H, W, C] float32
    x = x.permute(0, 3, 1, 2)  # [T, C, H, W]
    p, tp, m = geometry.patch_size, geometry.temporal_patch_size, geometry.merge_size
    pad = -x.shape[0] % tp
    if pad:
        x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)], dim=0)  # [T_pad, C, H, W]
    gt, gh, gw = x.shape[0] // tp, x.shape[2] // p, x.shape[3] // p
    x = x.reshape(gt, tp, CHANNELS, gh // m, m, p, gw // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # [gt, gh/m, gw/m, m, m, C, tp, p, p]
    return x.reshape(gt * gh * gw, CHANNELS * tp * p * p).to(out_dtype)  # [rows, width]


def packed_items(buffer: torch.Tensor, offsets: Offsets, thw: Sizes) -> list[torch.Tensor]:
    """Views [T, H, W, 3] of each item inside a flat uint8 buffer."""
    offs = [int(o) for o in (offsets.tolist() if isinstance(offsets, torch.Tensor) else offsets)]
    sizes = sizes_list(thw, 3, "thw")
    return [buffer[o : o + t * h * w * CHANNELS].view(t, h, w, CHANNELS)
            for o, (t, h, w) in zip(offs, sizes, strict=True)]


def patchify_packed_reference(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, **kwargs) -> torch.Tensor:
    """Reference for a packed batch: items' rows concatenated in order, [sum(t*h*w), width]."""
    return torch.cat([patchify_reference(f, **kwargs) for f in packed_items(buffer, offsets, thw)], dim=0)


def check_packed(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, geometry: PatchGeometry,
                 ) -> tuple[list[int], list[list[int]]]:
    """Assert the packed-batch contract; return offsets and (T, H, W) per item as Python ints."""
    assert isinstance(buffer, torch.Tensor) and buffer.dtype == torch.uint8, "buffer must be a uint8 tensor"
    assert buffer.ndim == 1 and buffer.is_contiguous(), "buffer must be 1-D and contiguous"
    offs = [int(o) for o in (offsets.tolist() if isinstance(offsets, torch.Tensor) else offsets)]
    sizes = sizes_list(thw, 3, "thw")
    assert len(offs) == len(sizes) and sizes, f"{len(offs)} offsets for {len(sizes)} items"
    unit = geometry.patch_size * geometry.merge_size
    for o, (t, h, w) in zip(offs, sizes, strict=True):
        assert h % unit == 0 and w % unit == 0, f"H, W must be multiples of {unit}, got {h}x{w}"
        assert 0 <= o and o + t * h * w * CHANNELS <= buffer.numel(), f"item at {o} overruns the buffer"
    return offs, sizes


@triton.jit
def _patchify_kernel(src_ptr, out_ptr, norm_ptr, meta_ptr, block_item_ptr, block_row_ptr,
                     BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr, PATCH: tl.constexpr,
                     TPATCH: tl.constexpr, MERGE: tl.constexpr, CH: tl.constexpr, OUT_BF16: tl.constexpr):
    WIDTH: tl.constexpr = CH * TPATCH * PATCH * PATCH
    item = tl.load(block_item_ptr + tl.program_id(0))
    meta = meta_ptr + item * 8  # src_off, T, H, W, out_row0, n_rows, gh, gw (int64)
    src_off, T, H, W = tl.load(meta), tl.load(meta + 1), tl.load(meta + 2), tl.load(meta + 3)
    out_row0, n_rows, gh, gw = tl.load(meta + 4), tl.load(meta + 5), tl.load(meta + 6), tl.load(meta + 7)
    r = tl.load(block_row_ptr + tl.program_id(0)) + tl.arange(0, BLOCK_R)  # [BR] item-local merge-order row
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)  # [BF] feature (c, tt, py, px)
    mask_r, mask_f = r < n_rows, f < WIDTH
    gt, in_t = r // (gh * gw), r % (gh * gw)
    blk, mh, mw = in_t // (MERGE * MERGE), (r // MERGE) % MERGE, r % MERGE
    ph = (blk // (gw // MERGE)) * MERGE + mh  # [BR] patch row
    pw = (blk % (gw // MERGE)) * MERGE + mw  # [BR] patch col
    c, tt = f // (TPATCH * PATCH * PATCH), (f // (PATCH * PATCH)) % TPATCH
    py, px = (f // PATCH) % PATCH, f % PATCH
    frame = tl.minimum(gt[:, None] * TPATCH + tt[None, :], T - 1)  # [BR, BF] odd T repeats the last frame
    y = ph[:, None] * PATCH + py[None, :]
    x = pw[:, None] * PATCH + px[None, :]
    mask = mask_r[:, None] & mask_f[None, :]
    v = tl.load(src_ptr + src_off + ((frame * H + y) * W + x) * CH + c[None, :], mask=mask, other=0)
    mean = tl.load(norm_ptr + c, mask=mask_f, other=0.0)  # [BF]
    std = tl.load(norm_ptr + CH + c, mask=mask_f, other=1.0)  # [BF]
    out = tl.math.div_rn(v.to(tl.float32) - mean[None, :], std[None, :])  # IEEE division, as torch
    dst = out_ptr + (out_row0 + r)[:, None] * WIDTH + f[None, :]
    tl.store(dst, cast_out(out, OUT_BF16, out_ptr.dtype.element_ty), mask=mask)


def item_meta(offs: list[int], sizes: list[list[int]], geometry: PatchGeometry,
              device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """Kernel item table [n, 8] int64 (src_off, T, H, W, out_row0, n_rows, gh, gw) and rows per item."""
    grids = [geometry.grid(s) for s in sizes]
    n_rows = [t * h * w for t, h, w in grids]
    row0 = exclusive_cumsum(n_rows)
    table = [[o, *s, r0, n, g[1], g[2]]
             for o, s, r0, n, g in zip(offs, sizes, row0, n_rows, grids, strict=True)]
    return torch.tensor(table, dtype=torch.int64).to(device), n_rows  # [n, 8]


def patchify_packed_triton(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, *,
                           out_dtype: torch.dtype = torch.float32, mean: Sequence[float] = CLIP_MEAN,
                           std: Sequence[float] = CLIP_STD,
                           geometry: PatchGeometry = QWEN2_VL) -> torch.Tensor:
    """Triton patchify of a packed batch: flat uint8 buffer + element offsets + (T, H, W) -> [rows, width]."""
    assert out_dtype in OUT_DTYPES, f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}"
    offs, sizes = check_packed(buffer, offsets, thw, geometry)
    dev = buffer.device
    meta, n_rows = item_meta(offs, sizes, geometry, dev)
    width = geometry.width
    out = torch.empty(sum(n_rows), width, dtype=out_dtype, device=dev)  # [rows, width]
    block_r, block_f = (32, 512) if interpreting() else (16, 128)
    block_item, block_row = row_blocks(n_rows, block_r, dev)
    grid = (block_item.numel(), triton.cdiv(width, block_f))
    _patchify_kernel[grid](buffer, out, norm_table(mean, std, dev), meta, block_item, block_row,
                           BLOCK_R=block_r, BLOCK_F=block_f, PATCH=geometry.patch_size,
                           TPATCH=geometry.temporal_patch_size, MERGE=geometry.merge_size, CH=CHANNELS,
                           OUT_BF16=out_dtype == torch.bfloat16, num_warps=4)
    return out


def patchify_triton(frames: torch.Tensor, **kwargs) -> torch.Tensor:
    """Triton patchify of one item: [T, H, W, 3] uint8 contiguous -> [t*h*w, width]."""
    assert isinstance(frames, torch.Tensor) and frames.dtype == torch.uint8, "frames must be a uint8 tensor"
    assert frames.ndim == 4 and frames.shape[3] == CHANNELS, f"frames must be [T,H,W,3]: {list(frames.shape)}"
    assert frames.is_contiguous(), "frames must be contiguous"
    return patchify_packed_triton(frames.view(-1), [0], [list(frames.shape[:3])], **kwargs)
