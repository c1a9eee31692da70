"""Qwen2-VL vision tower: patch embed, 2D-RoPE blocks with per-frame attention, patch merger."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mm_infer.media.frame_batch import FrameBatch
from mm_infer.models.config import VisionConfig
from mm_infer.models.half_linear import Linear
from mm_infer.models.layers import activation
from mm_infer.models.vision_ops import cu_seqlens_from_grid, varlen_attention
from mm_infer_kernels import dispatch as K


def vision_cos_sin(cfg: VisionConfig, grid_thw: list[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """float32 cos, sin [P, head_dim] of the 2D vision rope, rows in the processor's merge-block order."""
    return K.vision_rope_cos_sin(grid_thw, cfg.head_dim, theta=cfg.rope_theta, merge_size=cfg.spatial_merge_size,
                                 device=device)


class PatchEmbed(nn.Module):
    """Holds the Conv3d kernel flattened to [D, C*T*ph*pw]; HF's 5-D kernel is reshaped at load time.

    Qwen3-VL's Conv3d has a bias; Qwen2 / 2.5's have none."""

    def __init__(self, patch_dim: int, embed_dim: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(embed_dim, patch_dim))
        self.bias = nn.Parameter(torch.empty(embed_dim)) if bias else None

    def forward(self, pixels: Tensor | FrameBatch) -> Tensor:  # rows [P, patch_dim], or uint8 frames -> [P, D]
        if isinstance(pixels, FrameBatch):  # fused patchify + normalise + embed (Triton on CUDA)
            x = pixels.embed(self.weight)  # [P, D]
        else:
            x = K.patch_embed_rows(pixels, self.weight)
        return x if self.bias is None else x + self.bias


class VisionAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = Linear(dim, 3 * dim, bias=True)
        self.proj = Linear(dim, dim, bias=True)

    def forward(self, x: Tensor, cu_seqlens: list[int], cos: Tensor, sin: Tensor) -> Tensor:  # [P, D]
        p = x.shape[0]
        q, k, v = self.qkv(x).reshape(p, 3, self.num_heads, -1).unbind(1)  # 3 x [P, H, d]
        q, k = K.vision_rope(q, k, cos, sin)  # Triton on CUDA, torch reference on CPU
        out = varlen_attention(q, k, v, cu_seqlens)  # [P, H, d]
        return self.proj(out.reshape(p, -1))


class VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        self.fc1 = Linear(dim, hidden)
        self.fc2 = Linear(hidden, dim)
        self.act = activation(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionBlock(nn.Module):
    """Pre-norm block; `norm` and `mlp` differ between Qwen2-VL and Qwen2.5-VL."""

    def __init__(self, dim: int, num_heads: int, norm1: nn.Module, norm2: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.norm1, self.norm2, self.mlp = norm1, norm2, mlp
        self.attn = VisionAttention(dim, num_heads)

    def forward(self, x: Tensor, cu_seqlens: list[int], cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x), cu_seqlens, cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """norm, then each merge x merge block of patches concatenated -> MLP -> LM hidden size.

    postshuffle (Qwen3-VL DeepStack mergers): the norm runs on the concatenated block instead."""

    def __init__(self, embed_dim: int, out_dim: int, merge: int, ln_q: nn.Module, postshuffle: bool = False) -> None:
        super().__init__()
        self.merge, self.postshuffle = merge, postshuffle
        self.ln_q = ln_q
        hidden = embed_dim * merge * merge
        self.mlp = nn.Sequential(Linear(hidden, hidden), nn.GELU(), Linear(hidden, out_dim))

    def forward(self, x: Tensor) -> Tensor:  # [P, E] -> [P/merge^2, out_dim]
        if self.postshuffle:
            return self.mlp(self.ln_q(K.merge_units(x, self.merge)))
        return self.mlp(K.merge_units(self.ln_q(x), self.merge))


class Qwen2VisionTower(nn.Module):
    """pixel_values [P, patch_dim], grid_thw [M, 3] (host ints) -> merged embeddings [P/merge^2, out_dim]."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        e = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg.patch_dim, e)
        self.blocks = nn.ModuleList(
            VisionBlock(
                e,
                cfg.num_heads,
                nn.LayerNorm(e, eps=1e-6),
                nn.LayerNorm(e, eps=1e-6),
                VisionMLP(e, cfg.mlp_hidden, cfg.hidden_act),
            )
            for _ in range(cfg.depth)
        )
        self.merger = PatchMerger(e, cfg.out_dim, cfg.spatial_merge_size, nn.LayerNorm(e, eps=1e-6))

    def forward(self, pixel_values: Tensor, grid_thw: list[list[int]]) -> Tensor:
        x = self.patch_embed(pixel_values)  # [P, E]
        cos, sin = vision_cos_sin(self.cfg, grid_thw, x.device)  # [P, d] float32
        cu_seqlens = cu_seqlens_from_grid(grid_thw)
        for blk in self.blocks:
            x = blk(x, cu_seqlens, cos, sin)
        return self.merger(x)
