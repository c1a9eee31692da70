"""Shared inputs for kernel tests: random frames, odd shape cases, golden HF pixel_values turned back to uint8."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mm_infer_kernels._frames import Normalize

REPO = Path(__file__).resolve().parents[2]
SHARED_GOLDEN = REPO.parent / "shared" / "golden" / "qwen2vl"

# (T, H, W): 1x1 merge grid, odd T, T=1 image, non-square both ways, rows not a multiple of any block.
FRAME_CASES = [(1, 28, 28), (2, 28, 28), (3, 28, 56), (1, 56, 28), (5, 84, 56), (4, 56, 84)]
# Several differently sized items in one packed batch.
BATCH_CASE = [(1, 28, 28), (3, 56, 28), (2, 28, 84), (1, 84, 56)]


def frames_u8(t: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """Random uint8 RGB frames [T, H, W, 3] that include 0 and 255."""
    g = torch.Generator().manual_seed(seed * 100003 + t * 1009 + h * 31 + w)
    x = torch.randint(0, 256, (t, h, w, 3), dtype=torch.uint8, generator=g)
    x.view(-1)[:2] = torch.tensor([0, 255], dtype=torch.uint8)
    return x


def packed_with_gaps(items: list[torch.Tensor], gap: int = 7) -> tuple[torch.Tensor, list[int], list[list[int]]]:
    """Flat uint8 buffer holding the items with `gap` junk bytes before each (offsets are not a plain cumsum)."""
    parts, offsets, pos = [], [], 0
    for i, f in enumerate(items):
        parts += [torch.full((gap,), 200 + i, dtype=torch.uint8), f.reshape(-1)]
        offsets.append(pos + gap)
        pos += gap + f.numel()
    return torch.cat(parts), offsets, [list(f.shape[:3]) for f in items]


def golden_frames(name: str, kind: str, backend: str = "torchvision") -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(uint8 frames [2t, H, W, 3], HF pixel_values [rows, 1176], grid) from a golden npz (HF -> uint8 exactly)."""
    data = np.load(SHARED_GOLDEN / f"{name}.{backend}.npz")
    pv = torch.from_numpy(data["pixel_values" if kind == "image" else "pixel_values_videos"])  # [rows, 1176]
    t, h, w = (data["image_grid_thw" if kind == "image" else "video_grid_thw"][0]).tolist()
    x = pv.reshape(t, h // 2, w // 2, 2, 2, 3, 2, 14, 14)  # gt, bh, bw, mh, mw, c, tt, py, px
    x = x.permute(0, 6, 1, 3, 7, 2, 4, 8, 5).reshape(2 * t, h * 14, w * 14, 3)  # [T, H, W, C]
    table = Normalize(backend=backend).table("cpu")  # [2, C]
    scale = 1 if backend == "torchvision" else 255
    frames = ((x * table[1] + table[0]) * scale).round().clamp(0, 255).to(torch.uint8).contiguous()
    return frames, pv, [t, h, w]


def dispatch_ops() -> dict[str, torch.Tensor]:
    """One small input per op through mm_infer_kernels.dispatch (the torch references on CPU), results by name."""
    from mm_infer_kernels import dispatch

    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (3, 56, 28, 3), dtype=torch.uint8, generator=g)  # [T, H, W, 3]
    w = torch.randn(8, 3, 2, 14, 14, generator=g)  # Conv3d weight [D, 3, tp, p, p]
    grid = dispatch.grid_thw([[3, 56, 28]])  # [[2, 4, 2]]
    q, k = torch.randn(2, 16, 2, 16, generator=g)  # [S, H, Dh] each
    cos, sin = dispatch.vision_rope_cos_sin(grid, 16)  # [S, Dh] float32
    rows = dispatch.patchify(frames)  # [16, 1176]
    return {"rows": rows, "embed": dispatch.patch_embed(frames, w),
            "rows_embed": dispatch.patch_embed_rows(rows, w.flatten(1)),
            "rope": torch.stack(dispatch.vision_rope(q, k, cos, sin)), "merge": dispatch.patch_merge(rows, grid),
            "units": dispatch.merge_units(rows)}


def paged_cache(ctx: list[int], hkv: int, d: int, block: int, g: torch.Generator
                ) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """Caches [Hkv, slots, D] holding each sequence's ctx keys in shuffled blocks (3 spare), and the block tables
    padded with block 0 to the widest (paged decode / prefill tests)."""
    nblk = [-(-c // block) for c in ctx]
    total = sum(nblk) + 3
    order = torch.randperm(total, generator=g).tolist()
    k = torch.randn(hkv, total * block, d, generator=g)
    v = torch.randn(hkv, total * block, d, generator=g)
    width = max(nblk)
    tables, at = [], 0
    for n in nblk:
        tables.append(order[at:at + n] + [0] * (width - n))
        at += n
    return k, v, tables
