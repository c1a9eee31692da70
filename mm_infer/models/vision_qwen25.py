"""Qwen2.5-VL vision tower: RMSNorm + SwiGLU blocks, window attention with full-attention blocks."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from mm_infer.models.config import VisionConfig
from mm_infer.models.layers import GatedMLP, RMSNorm
from mm_infer.models.vision import PatchEmbed, PatchMerger, VisionBlock, vision_cos_sin
from mm_infer.models.vision_ops import cu_seqlens_from_grid


def window_index(grid_thw: list[list[int]], merge: int, window_size: int, patch_size: int
                 ) -> tuple[np.ndarray, list[int]]:
    """Reorder of merge units into windows, and the windows' boundaries in patches (host side, numpy).

    Returns (index [P/merge^2] int64, cu_window_seqlens [W+1]), as HF's get_vision_window_index.
    """
    win = window_size // merge // patch_size  # window side in merge units
    unit = merge * merge
    indices: list[np.ndarray] = []
    cu: list[int] = [0]
    offset = 0
    for t, h, w in grid_thw:
        gh, gw = h // merge, w // merge
        index = np.arange(t * gh * gw, dtype=np.int64).reshape(t, gh, gw)
        pad_h, pad_w = win - gh % win, win - gw % win
        nh, nw = (gh + pad_h) // win, (gw + pad_w) // win
        padded = np.pad(index, ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-100)  # [t, gh+pad_h, gw+pad_w]
        padded = padded.reshape(t, nh, win, nw, win).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, win, win)
        seqlens = (padded != -100).sum(axis=(2, 3)).reshape(-1)  # [t*nh*nw] units per window
        padded = padded.reshape(-1)
        indices.append(padded[padded != -100] + offset)
        cu.extend((seqlens.cumsum() * unit + cu[-1]).tolist())
        offset += t * gh * gw
    cu = [b for i, b in enumerate(cu) if i == 0 or b != cu[i - 1]]  # drop empty windows
    return np.concatenate(indices), cu


def permute_units(x: Tensor, index: Tensor, unit: int) -> Tensor:
    """Reorder x [P, ...] by merge unit (groups of `unit` consecutive rows) following index."""
    return x.reshape(-1, unit, *x.shape[1:])[index].reshape(x.shape)


class Qwen25VisionTower(nn.Module):
    """pixel_values [P, patch_dim], grid_thw [M, 3] -> merged embeddings [P/merge^2, out_dim]."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        e = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg.patch_dim, e)
        self.blocks = nn.ModuleList(
            VisionBlock(
                e,
                cfg.num_heads,
                RMSNorm(e, eps=1e-6),
                RMSNorm(e, eps=1e-6),
                GatedMLP(e, cfg.mlp_hidden, cfg.hidden_act, bias=True),
            )
            for _ in range(cfg.depth)
        )
        self.merger = PatchMerger(e, cfg.out_dim, cfg.spatial_merge_size, RMSNorm(e, eps=1e-6))

    def forward(self, pixel_values: Tensor, grid_thw: list[list[int]]) -> Tensor:
        cfg = self.cfg
        unit = cfg.spatial_merge_size**2
        x = self.patch_embed(pixel_values)  # [P, E]
        cos, sin = vision_cos_sin(cfg, grid_thw, x.device)  # [P, d] float32
        host_index, cu_window = window_index(grid_thw, cfg.spatial_merge_size, cfg.window_size, cfg.patch_size)
        index = torch.from_numpy(host_index).to(x.device, non_blocking=True)  # [P/unit]
        x, cos, sin = (permute_units(a, index, unit) for a in (x, cos, sin))  # window order
        cu_full = cu_seqlens_from_grid(grid_thw)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cu_full if i in cfg.fullatt_block_indexes else cu_window, cos, sin)
        merged = self.merger(x)  # [P/unit, out_dim], window order
        return merged[torch.argsort(index)]
