"""Packed uint8 frame batches shared by the patchify ops: layout, offsets, item tables (host side, plain torch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from mm_infer_kernels._items import exclusive_cumsum, sizes_list
from mm_infer_kernels.geometry import CHANNELS, CLIP, QWEN2_VL, RESCALE, Normalize, PatchGeometry

Sizes = Sequence[Sequence[int]] | torch.Tensor
Offsets = Sequence[int] | torch.Tensor
Layout = Literal["thwc", "tchw"]

__all__ = ["CHANNELS", "CLIP", "QWEN2_VL", "Normalize", "PatchGeometry", "Sizes", "Offsets", "Layout",
           "rescale_tensor", "as_thwc", "item_view", "check_packed", "single_item", "item_meta"]


def rescale_tensor(device: torch.device | str, rescale: float = RESCALE) -> torch.Tensor:
    """[1] float64 rescale factor (1/255) for the pil backend's float64 rescale inside kernels."""
    return torch.tensor([rescale], dtype=torch.float64, device=device)


def as_thwc(item: torch.Tensor, layout: Layout) -> torch.Tensor:
    """A flat item in `layout` -> [T, H, W, 3] view (channels-first storage comes back permuted)."""
    return item.permute(0, 2, 3, 1) if layout == "tchw" else item


def item_view(buffer: torch.Tensor, offset: int, thw: Sequence[int], layout: Layout) -> torch.Tensor:
    """[T, H, W, 3] view of one item stored at `offset` in a flat buffer."""
    t, h, w = thw
    flat = buffer[offset : offset + t * h * w * CHANNELS]
    return as_thwc(flat.view(t, CHANNELS, h, w), layout) if layout == "tchw" else flat.view(t, h, w, CHANNELS)


def check_packed(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, geometry: PatchGeometry,
                 layout: Layout) -> tuple[list[int], list[list[int]]]:
    """Assert the packed-batch contract; return offsets and (T, H, W) per item as Python ints."""
    assert isinstance(buffer, torch.Tensor) and buffer.dtype == torch.uint8, "buffer must be a uint8 tensor"
    assert buffer.ndim == 1 and buffer.is_contiguous(), "buffer must be 1-D and contiguous"
    assert layout in ("thwc", "tchw"), f"layout must be 'thwc' or 'tchw', got {layout!r}"
    offs = [int(o) for o in (offsets.tolist() if isinstance(offsets, torch.Tensor) else offsets)]
    sizes = sizes_list(thw, 3, "thw")
    assert len(offs) == len(sizes) and sizes, f"{len(offs)} offsets for {len(sizes)} items"
    unit = geometry.patch_size * geometry.merge_size
    for o, (t, h, w) in zip(offs, sizes, strict=True):
        assert h % unit == 0 and w % unit == 0, f"H, W must be multiples of {unit}, got {h}x{w}"
        assert 0 <= o and o + t * h * w * CHANNELS <= buffer.numel(), f"item at {o} overruns the buffer"
    return offs, sizes


def single_item(frames: torch.Tensor) -> tuple[torch.Tensor, list[int], list[list[int]], Layout]:
    """One item [T, H, W, 3] uint8, channels-last contiguous or a permuted contiguous [T, 3, H, W]."""
    assert isinstance(frames, torch.Tensor) and frames.dtype == torch.uint8, "frames must be a uint8 tensor"
    assert frames.ndim == 4 and frames.shape[3] == CHANNELS, f"frames must be [T,H,W,3]: {list(frames.shape)}"
    t, h, w, _ = frames.shape
    if frames.is_contiguous():
        return frames.view(-1), [0], [[t, h, w]], "thwc"
    chw = frames.permute(0, 3, 1, 2)  # [T, 3, H, W]
    assert chw.is_contiguous(), "frames must be contiguous, or a [T, 3, H, W] contiguous tensor permuted"
    return chw.view(-1), [0], [[t, h, w]], "tchw"


def item_meta(offs: list[int], sizes: list[list[int]], geometry: PatchGeometry,
              device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """Kernel item table [n, 8] int64 (src_off, T, H, W, out_row0, n_rows, gh, gw) and rows per item."""
    grids = [geometry.grid(s) for s in sizes]
    n_rows = [t * h * w for t, h, w in grids]
    row0 = exclusive_cumsum(n_rows)
    table = [[o, *s, r0, n, g[1], g[2]] for o, s, r0, n, g in zip(offs, sizes, row0, n_rows, grids, strict=True)]
    return torch.tensor(table, dtype=torch.int64).to(device), n_rows  # [n, 8]
