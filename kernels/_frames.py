"""Frame-side pieces shared by the patchify ops: geometry, normalisation, packed uint8 batches, gather helpers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from kernels._items import exclusive_cumsum, sizes_list
from kernels._triton import tl, triton

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
CHANNELS = 3
Sizes = Sequence[Sequence[int]] | torch.Tensor
Offsets = Sequence[int] | torch.Tensor
Layout = Literal["thwc", "tchw"]


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


@dataclass(frozen=True)
class Normalize:
    """uint8 -> float32 normalisation with the float arithmetic of one HF processor backend.

    torchvision: one fused float32 step (x - mean*255) / (std*255).
    pil: float32(float64(x) * (1/255)), then (x - mean) / std in float32.
    """

    mean: tuple[float, ...] = CLIP_MEAN
    std: tuple[float, ...] = CLIP_STD
    backend: Literal["torchvision", "pil"] = "torchvision"

    def table(self, device: torch.device | str) -> torch.Tensor:
        """[2, 3] float32 (subtrahend, divisor) per channel, rounded to float32 as HF does."""
        assert self.backend in ("torchvision", "pil"), f"unknown normalisation backend {self.backend!r}"
        scale = 255 if self.backend == "torchvision" else 1
        return torch.stack([torch.tensor(self.mean) * scale, torch.tensor(self.std) * scale]).to(device)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Reference: uint8 [..., 3] channels-last -> float32 [..., 3]."""
        t = self.table(x.device)  # [2, C]
        v = x.float() if self.backend == "torchvision" else (x.double() * (1 / 255)).float()
        return (v - t[0]) / t[1]


QWEN2_VL = PatchGeometry()
CLIP = Normalize()


def rescale_tensor(device: torch.device | str) -> torch.Tensor:
    """[1] float64 1/255 for the pil backend's float64 rescale inside kernels."""
    return torch.tensor([1 / 255], dtype=torch.float64, device=device)


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


@triton.jit
def row_coords(r, gh, gw, MERGE: tl.constexpr):
    """Merge-order row index -> (temporal group, patch row, patch col) in the item's patch grid."""
    blk = (r % (gh * gw)) // (MERGE * MERGE)
    ph = (blk // (gw // MERGE)) * MERGE + (r // MERGE) % MERGE
    pw = (blk % (gw // MERGE)) * MERGE + r % MERGE
    return r // (gh * gw), ph, pw


@triton.jit
def gather_normalized(src_ptr, norm_ptr, rescale_ptr, src_off, T, H, W, gt, ph, pw, mask_r, f,
                      PATCH: tl.constexpr, TPATCH: tl.constexpr, CH: tl.constexpr, CHW: tl.constexpr,
                      PIL: tl.constexpr):
    """[BR, BF] float32 normalised pixels of rows (gt, ph, pw) [BR] at features f [BF] = (c, tt, py, px)."""
    mask_f = f < CH * TPATCH * PATCH * PATCH
    c, tt = f // (TPATCH * PATCH * PATCH), (f // (PATCH * PATCH)) % TPATCH
    frame = tl.minimum(gt[:, None] * TPATCH + tt[None, :], T - 1)  # [BR, BF] odd T repeats the last frame
    y = ph[:, None] * PATCH + ((f // PATCH) % PATCH)[None, :]
    x = pw[:, None] * PATCH + (f % PATCH)[None, :]
    if CHW:
        addr = ((frame * CH + c[None, :]) * H + y) * W + x
    else:
        addr = ((frame * H + y) * W + x) * CH + c[None, :]
    v = tl.load(src_ptr + src_off + addr, mask=mask_r[:, None] & mask_f[None, :], other=0).to(tl.float32)
    if PIL:
        v = (v.to(tl.float64) * tl.load(rescale_ptr)).to(tl.float32)
    sub = tl.load(norm_ptr + c, mask=mask_f, other=0.0)  # [BF]
    div = tl.load(norm_ptr + CH + c, mask=mask_f, other=1.0)  # [BF]
    return tl.math.div_rn(v - sub[None, :], div[None, :])  # IEEE division, as torch
