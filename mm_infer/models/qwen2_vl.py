"""Top-level Qwen2-VL / Qwen2.5-VL model: vision tower + merger, M-RoPE LM, and the LM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mm_infer.models.attention import AttentionContext, DenseAttentionContext
from mm_infer.models.config import ModelConfig
from mm_infer.models.language import TextModel
from mm_infer.models.vision import Qwen2VisionTower
from mm_infer.models.vision_qwen25 import Qwen25VisionTower


def scatter_embeddings(inputs_embeds: Tensor, mask: Tensor, embeds: Tensor, what: str = "media") -> Tensor:
    """Write embeds [K, D] into the rows of inputs_embeds [N, D] where mask [N] is True, in order."""
    n = int(mask.sum())
    if n != embeds.shape[0]:
        raise ValueError(f"{what}: {n} placeholder tokens but {embeds.shape[0]} embeddings")
    out = inputs_embeds.clone()
    out[mask] = embeds.to(out.dtype)
    return out


class QwenVLModel(nn.Module):
    """Flat, unpadded batches in; the KV cache (if any) lives behind the AttentionContext."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        tower = Qwen25VisionTower if config.kind == "qwen2_5_vl" else Qwen2VisionTower
        self.visual = tower(config.vision)
        self.language = TextModel(config.text)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.text.hidden_size, config.text.vocab_size, bias=False)
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.language.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.language.embed_tokens.weight.device

    def embed_tokens(self, input_ids: Tensor) -> Tensor:
        """input_ids [N] -> [N, D]."""
        return self.language.embed_tokens(input_ids)

    def encode_vision(self, pixel_values: Tensor, grid_thw: Tensor | list) -> Tensor:
        """pixel_values [P, C*T*ph*pw], grid_thw [M, 3] -> [sum(t*h*w)/merge^2, D] (images or videos).

        The grid is host metadata: pass a list to keep a device tensor's grid from costing a host sync.
        """
        grid = grid_thw.reshape(-1, 3).tolist() if isinstance(grid_thw, Tensor) else [list(g) for g in grid_thw]
        patches = sum(t * h * w for t, h, w in grid)
        if patches != pixel_values.shape[0]:
            raise ValueError(f"grid_thw covers {patches} patches, got {pixel_values.shape[0]}")
        return self.visual(pixel_values.to(self.device, self.dtype), grid)

    def forward_hidden(self, inputs_embeds: Tensor, positions: Tensor, ctx: AttentionContext) -> Tensor:
        """inputs_embeds [N, D], positions [3, N] -> final-normed hidden states [N, D]."""
        return self.language(inputs_embeds, positions.to(inputs_embeds.device), ctx)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden [N, D] -> float32 logits [N, V] (tied head reuses the embedding matrix)."""
        weight = self.language.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        pixel_values: Tensor | None = None,
        image_grid_thw: Tensor | None = None,
        pixel_values_videos: Tensor | None = None,
        video_grid_thw: Tensor | None = None,
        ctx: AttentionContext | None = None,
    ) -> Tensor:
        """Full forward on flat input_ids [N] -> float32 logits [N, V]; ctx defaults to one causal sequence."""
        input_ids = input_ids.to(self.device)
        embeds = self.embed_tokens(input_ids)  # [N, D]
        media = (
            (pixel_values, image_grid_thw, self.config.image_token_id, "image"),
            (pixel_values_videos, video_grid_thw, self.config.video_token_id, "video"),
        )
        for pixels, grid, token_id, what in media:
            if pixels is not None:
                if grid is None:
                    raise ValueError(f"{what} pixel values given without a grid_thw")
                embeds = scatter_embeddings(embeds, input_ids == token_id, self.encode_vision(pixels, grid), what)
        ctx = ctx if ctx is not None else DenseAttentionContext([input_ids.shape[0]])
        return self.compute_logits(self.forward_hidden(embeds, positions, ctx))
