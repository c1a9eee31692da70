"""Qwen3-VL vision tower: Qwen2-VL blocks with a GELU-tanh MLP, patch-embed bias, learned positions, DeepStack."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mm_infer.models.config import VisionConfig
from mm_infer.models.vision import PatchEmbed, PatchMerger, VisionBlock, VisionMLP, vision_cos_sin
from mm_infer.models.vision_ops import cu_seqlens_from_grid


def _axis_taps(size: int, side: int) -> tuple[Tensor, Tensor]:
    """Bilinear, align_corners=True taps of `size` target positions into a `side`-long axis: ([size, 2], [size, 2])."""
    src = torch.arange(size, dtype=torch.float32) * (side - 1) / max(size - 1, 1)  # [size], float32 as HF
    floor = torch.floor(src)
    offsets = torch.arange(2)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)  # [size, 2]
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)  # [size, 2]
    return taps, weights


def position_taps(grid_thw: list[list[int]], side: int, merge: int) -> tuple[Tensor, Tensor]:
    """Per patch (merge-block order, repeated over t) 4 taps into the side x side learned grid and their weights.

    Returns (indices [P, 4] long, weights [P, 4] float32), as HF's get_vision_interpolation_indices_and_weights.
    """
    indices, weights = [], []
    for t, h, w in grid_thw:
        hi, hw = _axis_taps(h, side)
        wi, ww = _axis_taps(w, side)
        idx = (hi[:, None, :, None] * side + wi[None, :, None, :]).reshape(h, w, 4)  # taps (h0w0, h0w1, h1w0, h1w1)
        wt = (hw[:, None, :, None] * ww[None, :, None, :]).reshape(h, w, 4)  # [h, w, 4]
        for out, grid in ((indices, idx), (weights, wt)):
            blocks = grid.reshape(h // merge, merge, w // merge, merge, 4).permute(0, 2, 1, 3, 4)  # merge order
            out.append(blocks.reshape(h * w, 4).repeat(t, 1))  # [t*h*w, 4]
    return torch.cat(indices), torch.cat(weights)


class Qwen3VisionTower(nn.Module):
    """pixel_values [P, patch_dim], grid_thw (host ints) -> [P/merge^2, (1 + L) * out_dim].

    The merged features come first, then those of each of the L deepstack_visual_indexes blocks, side by side,
    so that one tensor per item goes through the encoder cache; QwenVLModel.split_vision takes them apart.
    """

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        e, merge = cfg.embed_dim, cfg.spatial_merge_size
        self.patch_embed = PatchEmbed(cfg.patch_dim, e, bias=True)
        self.pos_embed = nn.Embedding.from_pretrained(torch.empty(cfg.num_position_embeddings, e), freeze=False)
        self.side = int(cfg.num_position_embeddings**0.5)
        self.blocks = nn.ModuleList(
            VisionBlock(e, cfg.num_heads, nn.LayerNorm(e, eps=1e-6), nn.LayerNorm(e, eps=1e-6),
                        VisionMLP(e, cfg.mlp_hidden, cfg.hidden_act))
            for _ in range(cfg.depth)
        )
        self.merger = PatchMerger(e, cfg.out_dim, merge, nn.LayerNorm(e, eps=1e-6))
        self.deepstack_merger_list = nn.ModuleList(
            PatchMerger(e, cfg.out_dim, merge, nn.LayerNorm(e * merge * merge, eps=1e-6), postshuffle=True)
            for _ in cfg.deepstack_visual_indexes
        )

    def positions(self, grid_thw: list[list[int]], device: torch.device) -> Tensor:
        """Learned position embeddings [P, E] (float32), bilinearly resampled to each item's grid."""
        idx, weights = position_taps(grid_thw, self.side, self.cfg.spatial_merge_size)  # [P, 4] each, host
        idx, weights = idx.to(device, non_blocking=True), weights.to(device, non_blocking=True)
        return (self.pos_embed(idx) * weights[:, :, None]).sum(1)  # [P, E]

    def forward(self, pixel_values: Tensor, grid_thw: list[list[int]]) -> Tensor:
        cfg = self.cfg
        x = self.patch_embed(pixel_values)  # [P, E]
        x = x + self.positions(grid_thw, x.device).to(x.dtype)
        cos, sin = vision_cos_sin(cfg, grid_thw, x.device)  # [P, d] float32
        cu_seqlens = cu_seqlens_from_grid(grid_thw)
        deep: list[Tensor] = []
        for i, blk in enumerate(self.blocks):
            x = blk(x, cu_seqlens, cos, sin)
            if i in cfg.deepstack_visual_indexes:
                deep.append(self.deepstack_merger_list[cfg.deepstack_visual_indexes.index(i)](x))  # [P/m², D]
        return torch.cat([self.merger(x), *deep], dim=-1)  # [P/m², (1 + L) * D]
